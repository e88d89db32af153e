"""``adapter_config.json``: where LoRA goes (``target_modules``, ``exclude_modules``, ``layers_to_transform``).

Field semantics follow PEFT ``src/peft/tuners/lora/config.py`` (``LoraConfig``) and PEFT
``check_target_module_exists`` (``src/peft/tuners/tuners_utils.py``). Resolving these against the base model's
real modules is ``adapters_app.validation.targets``.
"""

from __future__ import annotations

import re
from typing import Any

from adapters_app.validation.problems import Problem, config_error
from adapters_app.validation.safe_regex import regex_problem


def excluded(exclude: list[str] | str | None, path: str) -> bool:
    """Whether ``exclude_modules`` (a regex string that must ``fullmatch``, or names/``.``-suffixes) excludes
    ``path``."""
    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, path) is not None
    return path in exclude or any(path.endswith("." + e) for e in exclude)


def target_modules(doc: dict[str, Any], problems: list[Problem]) -> list[str] | str | None:
    """``target_modules`` as a de-duplicated list of names or one safe regex string; None with a problem appended
    when missing or malformed."""
    tm = doc.get("target_modules")
    if tm is None:
        problems.append(
            config_error(
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
                config_error(
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
        config_error(
            "config_invalid_field",
            "target_modules",
            "target_modules must be a non-empty list of names or a regex string.",
            'List the module names LoRA was applied to, e.g. ["q_proj", "v_proj"].',
        )
    )
    return None


def exclude_modules(doc: dict[str, Any], problems: list[Problem]) -> list[str] | str | None:
    """``exclude_modules`` as a list of names or one safe regex string; None when absent or malformed (then with a
    problem appended)."""
    ex = doc.get("exclude_modules")
    if ex is None or ex == []:
        return None
    if isinstance(ex, str):
        why = regex_problem(ex)
        if why is not None:
            problems.append(
                config_error(
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
        config_error(
            "config_invalid_field",
            "exclude_modules",
            "exclude_modules must be a list of names or a regex string.",
            "Fix exclude_modules or remove it.",
        )
    )
    return None


def layers(doc: dict[str, Any], problems: list[Problem]) -> list[int] | None:
    """``layers_to_transform`` as sorted unique indices; None when absent or malformed (then with a problem)."""
    lt = doc.get("layers_to_transform")
    if lt is None or lt == []:
        return None
    if isinstance(lt, int) and not isinstance(lt, bool) and lt >= 0:
        return [lt]
    if isinstance(lt, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in lt):
        return sorted(set(lt))
    problems.append(
        config_error(
            "config_invalid_field",
            "layers_to_transform",
            "layers_to_transform must be a layer index or a list of them.",
            "Fix layers_to_transform or remove it.",
        )
    )
    return None


def layers_with_regex_problem(layer_list: list[int] | None, targets: list[str] | str | None) -> Problem | None:
    """The error for ``layers_to_transform`` next to a regex ``target_modules`` (PEFT refuses the pair), or None."""
    if layer_list is None or not isinstance(targets, str):
        return None
    return config_error(
        "config_invalid_field",
        "layers_to_transform",
        "layers_to_transform is set while target_modules is a regex string; PEFT refuses this "
        "combination when loading the adapter.",
        "Put the layer restriction into the target_modules regex, or list target_modules by name.",
    )
