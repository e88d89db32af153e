"""Parsing ``adapter_config.json`` as PEFT writes it, old and new schema.

Field semantics follow PEFT ``src/peft/tuners/lora/config.py`` (``LoraConfig``)
and what vLLM 0.32 accepts (``vllm/lora/peft_helper.py``: required ``r``,
``lora_alpha``, ``target_modules``; ``_validate_features`` and
``validate_legal`` list the refused features). Each unsupported feature is an
error naming the engine limit; nothing is silently dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters_app.validation.problems import Problem, error, warning
from adapters_app.validation.safe_regex import MAX_PATTERNS, regex_problem

MAX_CONFIG_BYTES = 1 << 20

#: PEFT ``TaskType`` values; only causal LM adapters are served.
KNOWN_TASK_TYPES = frozenset(
    {"CAUSAL_LM", "SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION"}
)
#: ``init_lora_weights`` strings that only set initial weights (vllm ``PEFTHelper._init_is_supported``).
_PLAIN_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})
_LEGACY_KEYS = frozenset({"enable_lora", "merge_weights"})  # PEFT < 0.3 (MergedLinear era)
_CONFIG = "adapter_config.json"


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
        rank = _match_pattern(self.rank_pattern, module_path)
        alpha = _match_pattern(self.alpha_pattern, module_path)
        return (self.r if rank is None else int(rank)), (self.lora_alpha if alpha is None else float(alpha))

    def targets(self, module_path: str, layer: int | None) -> bool:
        """Whether PEFT would put LoRA on ``module_path`` (PEFT ``check_target_module_exists``).

        A regex string must ``fullmatch`` the path; list entries match the
        path exactly or as a ``.``-suffix, and only then restrict to
        ``layers_to_transform``. ``exclude_modules`` wins over targets.
        """
        if _excluded(self.exclude_modules, module_path):
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


def _match_pattern(pattern: Mapping[str, Any], name: str) -> Any:
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return None


def _excluded(exclude: list[str] | str | None, path: str) -> bool:
    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, path) is not None
    return path in exclude or any(path.endswith("." + e) for e in exclude)


def _valid_unicode(doc: Any) -> bool:
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


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
    if len(data) > MAX_CONFIG_BYTES:
        return (
            None,
            [
                _err(
                    "config_too_large",
                    None,
                    f"adapter_config.json is {len(data)} bytes; the limit is {MAX_CONFIG_BYTES}.",
                    "Upload the adapter_config.json written by PEFT `save_pretrained`.",
                )
            ],
            facts,
        )
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return (
            None,
            [
                _err(
                    "config_invalid_json",
                    None,
                    f"adapter_config.json is not valid UTF-8 JSON ({str(exc)[:120]}).",
                    "Upload the adapter_config.json written by PEFT `save_pretrained`.",
                )
            ],
            facts,
        )
    if not _valid_unicode(doc):
        # A \ud800-style escape decodes to a str that cannot be stored or shown: the version went ready and every
        # page listing it answered 500 (found by attacking the demo stack). The safetensors header refuses the same.
        return (
            None,
            [
                _err(
                    "config_invalid_json",
                    None,
                    "adapter_config.json has a string with an invalid \\u escape (an unpaired UTF-16 surrogate).",
                    "Upload the adapter_config.json written by PEFT `save_pretrained`.",
                )
            ],
            facts,
        )
    if not isinstance(doc, dict):
        return (
            None,
            [
                _err(
                    "config_invalid_json",
                    None,
                    "adapter_config.json is JSON but not an object.",
                    "Upload the adapter_config.json written by PEFT `save_pretrained`.",
                )
            ],
            facts,
        )

    if "peft_type" not in doc:
        return None, [_not_peft(doc)], facts
    peft_type = doc["peft_type"]
    facts["peft_type"] = peft_type
    if peft_type != "LORA":
        return (
            None,
            [
                _err(
                    "config_peft_type_unsupported",
                    "peft_type",
                    f"peft_type is {str(peft_type)[:40]!r}; only LoRA adapters are served.",
                    "Train a LoRA adapter (PEFT `LoraConfig`); vLLM serves no other PEFT method "
                    "(vllm/lora/peft_helper.py).",
                )
            ],
            facts,
        )
    facts["schema"] = "peft-legacy" if _LEGACY_KEYS & set(doc) else "peft"
    facts["peft_version"] = doc.get("peft_version")

    problems += _task_type(doc.get("task_type"), facts)
    r = _positive_int(doc, "r", problems, required=True)
    alpha = _lora_alpha(doc, problems)
    target_modules = _target_modules(doc, problems)
    exclude = _exclude_modules(doc, problems)
    rank_pattern = _pattern(doc, "rank_pattern", int, problems)
    alpha_pattern = _pattern(doc, "alpha_pattern", float, problems)
    layers = _layers(doc, problems)
    if layers is not None and isinstance(target_modules, str):
        problems.append(
            _err(
                "config_invalid_field",
                "layers_to_transform",
                "layers_to_transform is set while target_modules is a regex string; PEFT refuses this "
                "combination when loading the adapter.",
                "Put the layer restriction into the target_modules regex, or list target_modules by name.",
            )
        )
    use_rslora = _flag(doc, "use_rslora", problems)
    fan_in_fan_out = _flag(doc, "fan_in_fan_out", problems)
    problems += _unsupported_features(doc)
    if fan_in_fan_out:
        problems.append(
            warning(
                "config_fan_in_fan_out_ignored",
                "fan_in_fan_out",
                "fan_in_fan_out is true, but the base model's projections are nn.Linear, for which PEFT ignores it "
                "(it applies to GPT-2 style Conv1D layers).",
                "Nothing to do if the tensors have the nn.Linear layout; set it to false to silence this warning.",
            )
        )
    base = doc.get("base_model_name_or_path")
    facts["base_model_name_or_path"] = base if isinstance(base, str) else None
    if r is None or alpha is None or target_modules is None:
        return None, problems, facts
    config = AdapterConfig(
        r=r,
        lora_alpha=alpha,
        use_rslora=use_rslora,
        target_modules=target_modules,
        exclude_modules=exclude,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        layers_to_transform=layers,
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
        layers_to_transform=layers,
        max_rank=max([r, *rank_pattern.values()]),
    )
    return config, problems, facts


def _err(code: str, fld: str | None, message: str, hint: str) -> Problem:
    return error(code, fld if fld is not None else _CONFIG, message, hint)


def _not_peft(doc: dict[str, Any]) -> Problem:
    keys = set(doc)
    if keys & {"lora_parameters", "fine_tune_type"}:
        origin = "an MLX-LM LoRA config (lora_parameters / fine_tune_type)"
        hint = (
            "MLX adapters (adapters.safetensors) use other tensor names and no PEFT config; fuse with `mlx_lm.fuse` "
            "or convert to a PEFT LoRA adapter, then upload PEFT's adapter_config.json and adapter_model.safetensors."
        )
    elif "lora_rank" in keys or "jax" in str(doc.get("framework", "")).lower():
        origin = "a JAX LoRA config (lora_rank, einsum module names)"
        hint = (
            "Export the adapter to PEFT format (LoraConfig with r, lora_alpha, target_modules and tensors named "
            "base_model.model.model.layers.N.*.lora_A.weight) before uploading."
        )
    else:
        origin = "not a PEFT adapter config"
        hint = 'Upload the adapter_config.json written by PEFT `save_pretrained`; it has peft_type "LORA".'
    return _err(
        "config_not_peft",
        "peft_type",
        f"adapter_config.json has no peft_type: it looks like {origin}.",
        hint,
    )


def _task_type(task: Any, facts: dict[str, Any]) -> list[Problem]:
    facts["task_type"] = task
    if task is None or task == "CAUSAL_LM":
        return []
    if task in KNOWN_TASK_TYPES:
        return [
            _err(
                "config_task_type_unsupported",
                "task_type",
                f"task_type is {task}; Quiver serves text generation with causal language models (CAUSAL_LM).",
                'Train the adapter with task_type="CAUSAL_LM" on the registered base model; classification, '
                "seq2seq and feature-extraction adapters cannot be served by the generation engine.",
            )
        ]
    return [
        _err(
            "config_task_type_unknown",
            "task_type",
            f"task_type {str(task)[:40]!r} is not a PEFT task type.",
            'Set task_type to "CAUSAL_LM" (or remove it).',
        )
    ]


# Ranks are int32 in engines and in the database; JSON integers are unbounded.
MAX_INT = 2**31 - 1


def _finite_positive(value: Any) -> bool:
    """A positive, finite JSON number that converts to a float (huge integers overflow ``float``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:
        return False


def _positive_int(doc: dict[str, Any], key: str, problems: list[Problem], *, required: bool) -> int | None:
    if key not in doc or doc[key] is None:
        if required:
            problems.append(
                _err(
                    "config_missing_field",
                    key,
                    f"adapter_config.json has no {key!r}.",
                    f"Add {key!r} as PEFT writes it; the engine requires it.",
                )
            )
        return None
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_INT:
        problems.append(
            _err(
                "config_invalid_field",
                key,
                f"{key} must be a positive integer up to {MAX_INT}, got {str(value)[:40]!r}.",
                f"Set {key} to the rank the adapter was trained with.",
            )
        )
        return None
    return value


def _lora_alpha(doc: dict[str, Any], problems: list[Problem]) -> float | None:
    if "lora_alpha" not in doc or doc["lora_alpha"] is None:
        near = [k for k in ("alpha", "lora_scale", "scale") if k in doc]
        extra = f" It has {near[0]!r}, which PEFT does not read." if near else ""
        problems.append(
            _err(
                "config_missing_field",
                "lora_alpha",
                f"adapter_config.json has no 'lora_alpha'.{extra}",
                "Add 'lora_alpha' with the value used in training (the engine requires it; PEFT would silently "
                "use its default of 8, changing the adapter's strength).",
            )
        )
        return None
    value = doc["lora_alpha"]
    if not _finite_positive(value):
        problems.append(
            _err(
                "config_invalid_field",
                "lora_alpha",
                f"lora_alpha must be a positive number, got {str(value)[:40]!r}.",
                "Set lora_alpha to the value used in training.",
            )
        )
        return None
    return float(value)


def _target_modules(doc: dict[str, Any], problems: list[Problem]) -> list[str] | str | None:
    tm = doc.get("target_modules")
    if tm is None:
        problems.append(
            _err(
                "config_missing_field",
                "target_modules",
                "adapter_config.json has no target_modules.",
                "Save the adapter with PEFT `save_pretrained`, which writes the resolved target_modules.",
            )
        )
        return None
    if isinstance(tm, str):
        why = regex_problem(tm)
        if why is not None:
            problems.append(
                _err(
                    "config_invalid_field",
                    "target_modules",
                    f"target_modules {why}.",
                    "Use a list of module names (as PEFT save_pretrained writes), or a short regex without nested "
                    "repeats such as '.*\\.(q_proj|v_proj)'.",
                )
            )
            return None
        return tm
    if isinstance(tm, list) and tm and all(isinstance(t, str) and t for t in tm):
        return list(dict.fromkeys(tm))  # duplicates tolerated, order kept
    problems.append(
        _err(
            "config_invalid_field",
            "target_modules",
            "target_modules must be a non-empty list of names or a regex string.",
            'List the module names LoRA was applied to, e.g. ["q_proj", "v_proj"].',
        )
    )
    return None


def _exclude_modules(doc: dict[str, Any], problems: list[Problem]) -> list[str] | str | None:
    ex = doc.get("exclude_modules")
    if ex is None or ex == []:
        return None
    if isinstance(ex, str):
        why = regex_problem(ex)
        if why is not None:
            problems.append(
                _err(
                    "config_invalid_field",
                    "exclude_modules",
                    f"exclude_modules {why}.",
                    "Use a list of module names, or a short regex without nested repeats.",
                )
            )
            return None
        return ex
    if isinstance(ex, list) and all(isinstance(e, str) for e in ex):
        return ex
    problems.append(
        _err(
            "config_invalid_field",
            "exclude_modules",
            "exclude_modules must be a list of names or a regex string.",
            "Fix exclude_modules or remove it.",
        )
    )
    return None


def _pattern(doc: dict[str, Any], key: str, kind: type, problems: list[Problem]) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        problems.append(
            _err(
                "config_invalid_field",
                key,
                f"{key} must be an object of pattern -> value.",
                f"Fix {key} or remove it.",
            )
        )
        return {}
    out: dict[str, Any] = {}
    for pat, v in value.items():
        ok_num = _finite_positive(v)
        if kind is int:
            ok_num = ok_num and isinstance(v, int) and v <= MAX_INT
        why = regex_problem(pat) if len(value) <= MAX_PATTERNS else f"is one of over {MAX_PATTERNS} patterns"
        if why is not None:
            ok_num = False
        if not ok_num:
            problems.append(
                _err(
                    "config_invalid_field",
                    key,
                    f"{key}[{pat[:80]!r}] = {str(v)[:20]!r} is not a valid pattern and positive value"
                    + (f": the pattern {why}." if why else "."),
                    f"Each {key} key must be a module-name regex and each value a positive "
                    f"{'integer' if kind is int else 'number'}.",
                )
            )
            continue
        out[pat] = kind(v)
    return out


def _layers(doc: dict[str, Any], problems: list[Problem]) -> list[int] | None:
    lt = doc.get("layers_to_transform")
    if lt is None or lt == []:
        return None
    if isinstance(lt, int) and not isinstance(lt, bool) and lt >= 0:
        return [lt]
    if isinstance(lt, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in lt):
        return sorted(set(lt))
    problems.append(
        _err(
            "config_invalid_field",
            "layers_to_transform",
            "layers_to_transform must be a layer index or a list of them.",
            "Fix layers_to_transform or remove it.",
        )
    )
    return None


def _flag(doc: dict[str, Any], key: str, problems: list[Problem]) -> bool:
    v = doc.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        problems.append(
            _err(
                "config_invalid_field",
                key,
                f"{key} must be true or false, got {str(v)[:20]!r}.",
                f"Set {key} to true or false.",
            )
        )
        return False
    return v


def _unsupported_features(doc: dict[str, Any]) -> list[Problem]:
    """Features vLLM refuses or would silently ignore (vllm/lora/peft_helper.py)."""
    out: list[Problem] = []

    def refuse(code: str, key: str, what: str, hint: str) -> None:
        out.append(_err(code, key, what, hint))

    if doc.get("use_dora"):
        refuse(
            "config_dora_unsupported",
            "use_dora",
            "use_dora is true: DoRA adapters are not supported by the engine (vLLM refuses DoRA).",
            "Train a plain LoRA adapter (use_dora=false), or merge the DoRA adapter into a full model.",
        )
    bias = doc.get("bias", "none")
    if bias not in (None, "none"):
        refuse(
            "config_bias_unsupported",
            "bias",
            f"bias is {str(bias)[:20]!r}: trained biases are not supported by the engine (vLLM: 'Adapter bias is not supported').",
            'Train with bias="none".',
        )
    if doc.get("lora_bias"):
        refuse(
            "config_bias_unsupported",
            "lora_bias",
            "lora_bias is true: LoRA-B biases are not supported by the engine.",
            "Train with lora_bias=false.",
        )
    mts = doc.get("modules_to_save")
    if mts:
        names = ", ".join(str(m) for m in mts) if isinstance(mts, list) else str(mts)
        refuse(
            "config_modules_to_save_unsupported",
            "modules_to_save",
            f"modules_to_save lists {names[:120]}: full copies of modules are not served by the engine (vLLM accepts "
            "them only for classification heads of pooling models).",
            "Train without modules_to_save (for new tokens, use a base model that already has them).",
        )
    if doc.get("trainable_token_indices"):
        refuse(
            "config_trainable_tokens_unsupported",
            "trainable_token_indices",
            "trainable_token_indices is set: trained token embeddings are not applied by the engine, which would "
            "serve the base embeddings instead.",
            "Train without trainable_token_indices.",
        )
    init = doc.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
        refuse(
            "config_init_unsupported",
            "init_lora_weights",
            f"init_lora_weights is {init[:40]!r}: this init (PiSSA, OLoRA, CorDA, LoftQ) modifies the base model "
            "weights, which the shared base model does not have.",
            "Convert it to a plain LoRA adapter with PEFT's path_initial_model_for_weight_conversion.",
        )
    for key, what in (
        ("alora_invocation_tokens", "Activated LoRA (aLoRA)"),
        ("layer_replication", "layer_replication"),
        ("use_bdlora", "block-diagonal LoRA (BD-LoRA)"),
        ("use_qalora", "QALoRA"),
        ("target_parameters", "LoRA on raw parameters (target_parameters)"),
    ):
        if doc.get(key):
            refuse(
                "config_feature_unsupported",
                key,
                f"{key} is set: {what} is not supported by the engine.",
                f"Train without {key}.",
            )
    enable = doc.get("enable_lora")
    if enable is not None and not (isinstance(enable, list) and all(enable)):
        refuse(
            "config_feature_unsupported",
            "enable_lora",
            "enable_lora (PEFT < 0.3 MergedLinear) applies LoRA to only part of a fused projection, which the engine "
            "cannot represent.",
            "Re-train or convert with a current PEFT version.",
        )
    return out
