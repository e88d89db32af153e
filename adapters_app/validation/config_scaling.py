"""``adapter_config.json``: rank and scale (``r``, ``lora_alpha``, ``use_rslora``, ``rank_pattern``,
``alpha_pattern``) and the boolean flags.

Field semantics follow PEFT ``src/peft/tuners/lora/config.py`` (``LoraConfig``) and vLLM's
``vllm/lora/peft_helper.py`` (``PEFTHelper._match_pattern``, ``_scaling``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from adapters_app.validation.problems import Problem, config_error
from adapters_app.validation.safe_regex import MAX_PATTERNS, regex_problem

# Ranks are int32 in engines and in the database; JSON integers are unbounded.
MAX_INT = 2**31 - 1


def match_pattern(pattern: Mapping[str, Any], name: str) -> Any:
    """The value of the first key ``k`` of ``pattern`` with ``re.match(rf"(.*\\.)?({k})$", name)``, or None."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return None


def finite_positive(value: Any) -> bool:
    """A positive, finite JSON number that converts to a float (huge integers overflow ``float``)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:
        return False


def positive_int(doc: dict[str, Any], key: str, problems: list[Problem], *, required: bool) -> int | None:
    """``doc[key]`` as a positive int32 (``r``), or None with a problem appended (missing only if ``required``)."""
    if key not in doc or doc[key] is None:
        if required:
            problems.append(
                config_error(
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
            config_error(
                "config_invalid_field",
                key,
                f"{key} must be a positive integer up to {MAX_INT}, got {str(value)[:40]!r}.",
                f"Set {key} to the rank the adapter was trained with.",
            )
        )
        return None
    return value


def lora_alpha(doc: dict[str, Any], problems: list[Problem]) -> float | None:
    """``lora_alpha`` as a positive float, or None with a problem appended (it is required: PEFT's default of 8
    would silently change the adapter's strength)."""
    if "lora_alpha" not in doc or doc["lora_alpha"] is None:
        near = [k for k in ("alpha", "lora_scale", "scale") if k in doc]
        extra = f" It has {near[0]!r}, which PEFT does not read." if near else ""
        problems.append(
            config_error(
                "config_missing_field",
                "lora_alpha",
                f"adapter_config.json has no 'lora_alpha'.{extra}",
                "Add 'lora_alpha' with the value used in training (the engine requires it; PEFT would silently "
                "use its default of 8, changing the adapter's strength).",
            )
        )
        return None
    value = doc["lora_alpha"]
    if not finite_positive(value):
        problems.append(
            config_error(
                "config_invalid_field",
                "lora_alpha",
                f"lora_alpha must be a positive number, got {str(value)[:40]!r}.",
                "Set lora_alpha to the value used in training.",
            )
        )
        return None
    return float(value)


def pattern_map(doc: dict[str, Any], key: str, kind: type, problems: list[Problem]) -> dict[str, Any]:
    """``rank_pattern`` (``kind`` int) or ``alpha_pattern`` (float): the valid entries; each bad one (unsafe regex,
    non-positive value, past ``MAX_PATTERNS``) is a problem and is dropped."""
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        problems.append(
            config_error(
                "config_invalid_field",
                key,
                f"{key} must be an object of pattern -> value.",
                f"Fix {key} or remove it.",
            )
        )
        return {}
    out: dict[str, Any] = {}
    for pat, v in value.items():
        ok_num = finite_positive(v)
        if kind is int:
            ok_num = ok_num and isinstance(v, int) and v <= MAX_INT
        why = regex_problem(pat) if len(value) <= MAX_PATTERNS else f"is one of over {MAX_PATTERNS} patterns"
        if why is not None:
            ok_num = False
        if not ok_num:
            problems.append(
                config_error(
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


def flag(doc: dict[str, Any], key: str, problems: list[Problem]) -> bool:
    """A boolean field (``use_rslora``, ``fan_in_fan_out``); absent or null is False, anything else a problem."""
    v = doc.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        problems.append(
            config_error(
                "config_invalid_field",
                key,
                f"{key} must be true or false, got {str(v)[:20]!r}.",
                f"Set {key} to true or false.",
            )
        )
        return False
    return v
