"""Parsing ``adapter_config.json`` as PEFT writes it, old and new schema.

Field semantics follow PEFT ``src/peft/tuners/lora/config.py`` (``LoraConfig``)
and what vLLM 0.32 accepts (``vllm/lora/peft_helper.py``: required ``r``,
``lora_alpha``, ``target_modules``; ``_validate_features`` and
``validate_legal`` list the refused features). Each unsupported feature is an
error naming the engine limit; nothing is silently dropped.

The checks are grouped by PEFT field: what the file is (``config_identity``), rank and
scale (``config_scaling``), where LoRA goes (``config_targets``) and the features the
engine refuses (``config_features``); this module reads the document and assembles them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters_app.validation.config_features import fan_in_fan_out_warning, unsupported_features
from adapters_app.validation.config_identity import (
    not_peft_problem,
    peft_type_problem,
    schema_of,
    task_type_problems,
)
from adapters_app.validation.config_scaling import flag, lora_alpha, match_pattern, pattern_map, positive_int
from adapters_app.validation.config_targets import (
    exclude_modules,
    excluded,
    layers,
    layers_with_regex_problem,
    target_modules,
)
from adapters_app.validation.problems import Problem, config_error

MAX_CONFIG_BYTES = 1 << 20
_READ_HINT = "Upload the adapter_config.json written by PEFT `save_pretrained`."


@dataclass(frozen=True)
class AdapterConfig:
    """The LoRA settings the validator checks tensors against.

    Attributes:
        r: Default rank.
        lora_alpha: Default alpha.
        use_rslora: Scaling is ``alpha / sqrt(r)`` instead of ``alpha / r``
            (rsLoRA, arXiv:2312.03732; vLLM ``PEFTHelper._scaling``).
        target_modules: A list of names/suffixes, or one regex string.
        exclude_modules: Same forms, or ``None``.
        rank_pattern: Module-name pattern -> rank.
        alpha_pattern: Module-name pattern -> alpha.
        layers_to_transform: Layer indices LoRA is restricted to, or ``None``.
        base_model_name_or_path: As written by the trainer (may be ``None``).
        schema: ``"peft"`` or ``"peft-legacy"`` (pre-0.3 keys).
        fan_in_fan_out: As written; PEFT ignores it for ``nn.Linear`` layers.
    """

    r: int
    lora_alpha: float
    use_rslora: bool
    target_modules: list[str] | str
    exclude_modules: list[str] | str | None = None
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    layers_to_transform: list[int] | None = None
    base_model_name_or_path: str | None = None
    schema: str = "peft"
    fan_in_fan_out: bool = False

    def scaling(self, rank: int, alpha: float) -> float:
        """LoRA output scale for a module of ``rank`` and ``alpha``."""
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    def rank_and_alpha(self, module_path: str) -> tuple[int, float]:
        """Effective ``(rank, alpha)`` of a module after ``rank_pattern``/``alpha_pattern``.

        The first pattern key ``k`` with ``re.match(rf"(.*\\.)?({k})$", module_path)``
        wins (vllm ``PEFTHelper._match_pattern``, same rule as PEFT ``get_pattern_key``).

        Args:
            module_path: E.g. ``"model.layers.0.self_attn.q_proj"``.
        """
        rank = match_pattern(self.rank_pattern, module_path)
        alpha = match_pattern(self.alpha_pattern, module_path)
        return (self.r if rank is None else int(rank)), (self.lora_alpha if alpha is None else float(alpha))

    def targets(self, module_path: str, layer: int | None) -> bool:
        """Whether PEFT would put LoRA on ``module_path`` (PEFT ``check_target_module_exists``).

        A regex string must ``fullmatch`` the path; list entries match the
        path exactly or as a ``.``-suffix, and only then restrict to
        ``layers_to_transform``. ``exclude_modules`` wins over targets.
        """
        if excluded(self.exclude_modules, module_path):
            return False
        tm = self.target_modules
        if isinstance(tm, str):
            if tm.lower() == "all-linear":
                return module_path != "lm_head" and not module_path.endswith("embed_tokens")
            return re.fullmatch(tm, module_path) is not None
        if module_path in tm:
            return True
        if not any(module_path.endswith("." + t) for t in tm):
            return False
        if self.layers_to_transform is not None and layer is not None:
            return layer in self.layers_to_transform
        return True


def _valid_unicode(doc: Any) -> bool:
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def _read_document(data: bytes) -> dict[str, Any] | Problem:
    """The file as a JSON object, or the error that stops reading it."""
    if len(data) > MAX_CONFIG_BYTES:
        return config_error(
            "config_too_large", None, f"adapter_config.json is {len(data)} bytes; the limit is {MAX_CONFIG_BYTES}.",
            _READ_HINT,
        )
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return config_error(
            "config_invalid_json", None, f"adapter_config.json is not valid UTF-8 JSON ({str(exc)[:120]}).",
            _READ_HINT,
        )
    if not _valid_unicode(doc):
        # A \ud800-style escape decodes to a str that cannot be stored or shown: the version went ready and every
        # page listing it answered 500 (found by attacking the demo stack). The safetensors header refuses the same.
        return config_error(
            "config_invalid_json", None,
            "adapter_config.json has a string with an invalid \\u escape (an unpaired UTF-16 surrogate).",
            _READ_HINT,
        )
    if not isinstance(doc, dict):
        return config_error("config_invalid_json", None, "adapter_config.json is JSON but not an object.", _READ_HINT)
    return doc


def parse_config(data: bytes) -> tuple[AdapterConfig | None, list[Problem], dict[str, Any]]:
    """Parse and check ``adapter_config.json``.

    Args:
        data: The file's bytes.

    Returns:
        ``(config, problems, facts)``. ``config`` is ``None`` when the file
        cannot describe a LoRA adapter at all (then tensor checks against it
        are skipped); feature rejections (DoRA, bias, …) still return a
        config so tensors are checked too. ``facts`` holds what the report
        shows: ``r``, ``lora_alpha``, ``use_rslora``, ``scaling``,
        ``rank_pattern``, ``alpha_pattern``, ``task_type``, ``schema``,
        ``peft_version``, ``base_model_name_or_path``.
    """
    problems: list[Problem] = []
    facts: dict[str, Any] = {}
    doc = _read_document(data)
    if isinstance(doc, Problem):
        return None, [doc], facts
    if "peft_type" not in doc:
        return None, [not_peft_problem(doc)], facts
    facts["peft_type"] = doc["peft_type"]
    wrong_type = peft_type_problem(doc["peft_type"])
    if wrong_type is not None:
        return None, [wrong_type], facts
    facts["schema"] = schema_of(doc)
    facts["peft_version"] = doc.get("peft_version")

    problems += task_type_problems(doc.get("task_type"), facts)
    r = positive_int(doc, "r", problems, required=True)
    alpha = lora_alpha(doc, problems)
    targets = target_modules(doc, problems)
    exclude = exclude_modules(doc, problems)
    rank_pattern = pattern_map(doc, "rank_pattern", int, problems)
    alpha_pattern = pattern_map(doc, "alpha_pattern", float, problems)
    layer_list = layers(doc, problems)
    combo = layers_with_regex_problem(layer_list, targets)
    if combo is not None:
        problems.append(combo)
    use_rslora = flag(doc, "use_rslora", problems)
    fan_in_fan_out = flag(doc, "fan_in_fan_out", problems)
    problems += unsupported_features(doc)
    if fan_in_fan_out:
        problems.append(fan_in_fan_out_warning())
    base = doc.get("base_model_name_or_path")
    facts["base_model_name_or_path"] = base if isinstance(base, str) else None
    if r is None or alpha is None or targets is None:
        return None, problems, facts
    config = AdapterConfig(
        r=r,
        lora_alpha=alpha,
        use_rslora=use_rslora,
        target_modules=targets,
        exclude_modules=exclude,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        layers_to_transform=layer_list,
        base_model_name_or_path=facts["base_model_name_or_path"],
        schema=facts["schema"],
        fan_in_fan_out=fan_in_fan_out,
    )
    facts.update(
        r=r,
        lora_alpha=alpha,
        use_rslora=use_rslora,
        scaling=config.scaling(r, alpha),
        rank_pattern=dict(rank_pattern),
        alpha_pattern=dict(alpha_pattern),
        layers_to_transform=layer_list,
        max_rank=max([r, *rank_pattern.values()]),
    )
    return config, problems, facts
