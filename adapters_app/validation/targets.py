"""Resolving ``target_modules`` against the base model's real module paths, and engine limits."""

from __future__ import annotations

from typing import Any

from adapters_app.validation.base_model import BaseModelFacts, PoolLimits
from adapters_app.validation.config import AdapterConfig
from adapters_app.validation.problems import Problem, error, warning

_EMBEDDING_PATHS = ("model.embed_tokens", "lm_head")


def resolve_targets(
    config: AdapterConfig, base: BaseModelFacts, limits: PoolLimits
) -> tuple[list[Problem], dict[str, Any]]:
    """Resolve the config's targets on the base model and check them against the pool.

    Args:
        config: The parsed adapter config.
        base: The registered base model.
        limits: The node pool's engine limits.

    Returns:
        ``(problems, facts)``. Problems: ``target_modules_match_nothing``
        (error), ``target_module_not_in_base`` (warning: PEFT skips names a
        model lacks), ``engine_module_unsupported`` (error naming the pool
        setting ``allow_embedding_lora``), ``adapter_rank_too_high`` (error
        naming ``max_lora_rank``). Facts: ``target_modules`` (sorted leaf
        names), ``targeted_module_count``.
    """
    problems: list[Problem] = []
    matched: list[str] = []
    for path in base.module_paths():
        layer = int(path.split(".")[2]) if path.startswith("model.layers.") else None
        if config.targets(path, layer):
            matched.append(path)
    leaves = sorted({p.rsplit(".", 1)[-1] for p in matched})
    facts: dict[str, Any] = {"target_modules": leaves, "targeted_module_count": len(matched)}
    if not matched:
        problems.append(
            error(
                "target_modules_match_nothing",
                "target_modules",
                f"target_modules {_show(config.target_modules)} selects no module of {base.base_model_name} "
                f"(its layers have {', '.join(base.modules)}); the adapter would serve as the plain base model.",
                f"Train the adapter on {base.base_model_name}, targeting its modules.",
            )
        )
    elif isinstance(config.target_modules, list):
        unknown = [
            t
            for t in config.target_modules
            if not any(p == t or p.endswith("." + t) for p in base.module_paths())
        ]
        if unknown:
            problems.append(
                warning(
                    "target_module_not_in_base",
                    "target_modules",
                    f"target_modules names {', '.join(unknown[:10])}, which {base.base_model_name} does not have; "
                    "they are ignored (PEFT skips them too).",
                    "Remove them from target_modules to silence this warning.",
                )
            )
    emb = [p for p in matched if p in _EMBEDDING_PATHS]
    if emb and not limits.allow_embedding_lora:
        problems.append(
            error(
                "engine_module_unsupported",
                "target_modules",
                f"LoRA on {', '.join(p.rsplit('.', 1)[-1] for p in emb)} is not enabled on this node pool.",
                "Train without embed_tokens/lm_head in target_modules, or ask an operator to enable the pool setting "
                "`allow_embedding_lora`.",
            )
        )
    max_rank = max([config.r, *config.rank_pattern.values()])
    if max_rank > limits.max_lora_rank:
        fld = "r" if config.r == max_rank else "rank_pattern"
        problems.append(
            error(
                "adapter_rank_too_high",
                fld,
                f"The adapter's rank {max_rank} is above this node pool's max_lora_rank of {limits.max_lora_rank}.",
                f"Train with r <= {limits.max_lora_rank}, or ask an operator to raise the pool setting `max_lora_rank` "
                "(vLLM --max-lora-rank).",
            )
        )
    return problems, facts


def _show(tm: list[str] | str) -> str:
    if isinstance(tm, str):
        return repr(tm[:120])
    return "[" + ", ".join(tm[:10]) + (", ..." if len(tm) > 10 else "") + "]"
