"""The adapter gate: one report with every problem of a stored adapter folder (issues 2 and 3)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from adapters_app.validation.base_model import BaseModelFacts, PoolLimits
from adapters_app.validation.collector import ProblemCollector
from adapters_app.validation.config import MAX_CONFIG_BYTES, AdapterConfig, parse_config
from adapters_app.validation.intake import CONFIG_NAME, WEIGHTS_NAME, folder_problems, is_junk
from adapters_app.validation.problems import error, warning
from adapters_app.validation.report import ValidationReport
from adapters_app.validation.safetensors_header import SafetensorsHeader, parse_header
from adapters_app.validation.scan import scan_tensors
from adapters_app.validation.sniff import SNIFF_BYTES, sniff_weights
from adapters_app.validation.targets import resolve_targets
from adapters_app.validation.tensor_checks import ALLOWED_DTYPES, TensorCheckResult, check_tensors

logger = logging.getLogger(__name__)

_LOCAL_PATH = re.compile(r"^(/|\./|\.\./|~|[A-Za-z]:[\\/])")


def validate_adapter_dir(root: Path, *, base: BaseModelFacts, limits: PoolLimits) -> ValidationReport:
    """Check an adapter folder against a base model and a node pool's limits.

    Never raises for bad input: every finding becomes a :class:`Problem` in
    the report. Cost: config and header checks are O(header); the value scan
    streams the weights in bounded memory (see :mod:`scan`).

    Args:
        root: A local folder holding ``adapter_config.json`` and
            ``adapter_model.safetensors`` (as produced by :func:`extract_archive`
            or a multipart upload that passed :func:`check_upload_names`).
        base: Facts of the registered base model.
        limits: The pool's engine limits.

    Returns:
        The report; ``report.ok`` is False if any problem is an error.

    Raises:
        NotADirectoryError: If ``root`` is not a directory (a programming error).
    """
    if not root.is_dir():
        raise NotADirectoryError(f"validate_adapter_dir: {root} is not a directory")
    started = time.monotonic()
    out = ProblemCollector()
    facts: dict[str, Any] = {"base_model_name": base.base_model_name}

    names = sorted(p.name for p in root.iterdir() if p.is_file() and not is_junk((p.name,)))
    out.extend(folder_problems(names))

    config = _read_config(root / CONFIG_NAME, out, facts)
    header = _read_header(root / WEIGHTS_NAME, limits, out, facts)

    tensors: TensorCheckResult | None = None
    if header is not None:
        tensors = check_tensors(header.tensors, base=base, config=config, out=out)
        facts.update(tensors.facts)
        if not (tensors.pairs or tensors.shape_mismatches or tensors.rank_mismatches or tensors.variant_pairs):
            out.add(
                error(
                    "adapter_maps_to_nothing",
                    WEIGHTS_NAME,
                    f"No tensor of the adapter maps to a LoRA pair on {base.base_model_name}: it would serve as the "
                    "plain base model.",
                    f"Train the adapter on {base.base_model_name} with PEFT and upload its save_pretrained output.",
                )
            )
    if config is not None:
        problems, target_facts = resolve_targets(config, base, limits)
        out.extend(problems)
        facts.update(target_facts)
    _decide_base(facts, tensors, base, out)
    if header is not None and tensors is not None:
        _scan(root / WEIGHTS_NAME, header, tensors, out, facts)

    report = ValidationReport(problems=out.finish(), facts=facts)
    logger.info(
        "adapter.validated",
        extra={
            "ok": report.ok,
            "codes": sorted(set(report.codes)),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return report


def _read_config(path: Path, out: ProblemCollector, facts: dict[str, Any]) -> AdapterConfig | None:
    if not path.is_file():
        return None  # folder_problems already reported missing_adapter_config
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    config, problems, config_facts = parse_config(data)
    out.extend(problems)
    facts.update(config_facts)
    return config


def _read_header(
    path: Path, limits: PoolLimits, out: ProblemCollector, facts: dict[str, Any]
) -> SafetensorsHeader | None:
    if not path.is_file():
        return None
    size = path.stat().st_size
    facts["weights_bytes"] = size
    if size > limits.max_adapter_bytes:
        out.add(
            error(
                "adapter_too_large",
                WEIGHTS_NAME,
                f"adapter_model.safetensors is {size} bytes, above this node pool's per-adapter budget "
                f"max_adapter_bytes of {limits.max_adapter_bytes}.",
                "Lower r or the number of target_modules, or ask an operator to raise the pool setting "
                "`max_adapter_bytes`.",
            )
        )
    with open(path, "rb") as f:
        problem = sniff_weights(f.read(SNIFF_BYTES), size, WEIGHTS_NAME)
        if problem is not None:
            out.add(problem)
            return None
        f.seek(0)
        header, problems = parse_header(f, size, name=WEIGHTS_NAME)
    out.extend(problems)
    if header is not None:
        facts["header_bytes"] = header.header_bytes
    return header


def _decide_base(
    facts: dict[str, Any], tensors: TensorCheckResult | None, base: BaseModelFacts, out: ProblemCollector
) -> None:
    """Decide base-model fit by tensor shapes and say so when the config's name disagrees."""
    if tensors is None:
        decision = "undecided: the weights could not be read"
    elif (tensors.pairs or tensors.variant_pairs or tensors.rank_mismatches) and tensors.shape_mismatches == 0:
        decision = f"tensor shapes match {base.base_model_name}"
        if tensors.rank_mismatches:
            decision += " (but their ranks disagree with adapter_config.json)"
    elif tensors.shape_mismatches:
        decision = f"tensor shapes do not match {base.base_model_name}"
    else:
        decision = f"no tensor maps to {base.base_model_name}"
    facts["base_model_decision"] = decision
    if "base_model_name_or_path" not in facts:
        return  # not a PEFT LoRA config: there is no name to compare
    named = facts["base_model_name_or_path"]
    if named == base.base_model_name:
        return
    fix = f"Set base_model_name_or_path to {base.base_model_name!r} to silence this warning."
    if named is None:
        out.add(
            warning(
                "base_model_name_missing",
                "base_model_name_or_path",
                f"base_model_name_or_path is empty; decided by the tensor shapes instead: {decision}.",
                fix,
            )
        )
    elif _LOCAL_PATH.match(named):
        out.add(
            warning(
                "base_model_name_local_path",
                "base_model_name_or_path",
                f"base_model_name_or_path is a local path ({named[:120]}); decided by the tensor shapes "
                f"instead: {decision}.",
                fix,
            )
        )
    else:
        out.add(
            warning(
                "base_model_name_mismatch",
                "base_model_name_or_path",
                f"base_model_name_or_path names {named[:120]}, not {base.base_model_name}; decided by the tensor "
                f"shapes instead: {decision}.",
                fix,
            )
        )


def _scan(
    path: Path,
    header: SafetensorsHeader,
    tensors: TensorCheckResult,
    out: ProblemCollector,
    facts: dict[str, Any],
) -> None:
    float_tensors = [t for t in header.tensors if t.dtype in ALLOWED_DTYPES]
    started = time.monotonic()
    try:
        with open(path, "rb", buffering=0) as f:
            stats = scan_tensors(f, header.data_start, float_tensors)
    except (OSError, EOFError) as exc:
        out.add(
            error(
                "weights_unreadable",
                WEIGHTS_NAME,
                # strerror only: the exception's text would show the worker's temp path.
                f"adapter_model.safetensors could not be read ({getattr(exc, 'strerror', None) or type(exc).__name__}).",
                "Upload the file again.",
            )
        )
        return
    facts["scan_seconds"] = round(time.monotonic() - started, 3)
    b_names = set(tensors.b_tensors)
    zero_b = []
    for s in stats:
        if s.non_finite:
            out.add(
                error(
                    "tensor_non_finite",
                    s.name,
                    f"Tensor {s.name} contains {s.non_finite} NaN or Inf values.",
                    "Training diverged or the export failed; re-train (e.g. lower the learning rate) or re-export.",
                )
            )
        if s.name in b_names and s.all_zero:
            zero_b.append(s.name)
    if b_names and len(zero_b) == len(b_names):
        out.add(
            warning(
                "adapter_untrained",
                WEIGHTS_NAME,
                "Every lora_B tensor is all zeros: the adapter is untrained and behaves exactly like the base model.",
                "Upload the adapter saved after training, not the freshly initialised one.",
            )
        )
    else:
        for name in zero_b:
            out.add(
                warning(
                    "tensor_all_zero_b",
                    name,
                    f"{name} is all zeros, so LoRA on this module does nothing.",
                    "Check that this module was trained; an all-zero lora_B is PEFT's initial value.",
                )
            )
