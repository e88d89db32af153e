"""Residency tiers of an adapter version on one node.

vLLM keeps two caches per engine (``vllm/lora/worker_manager.py``, ``LRUCacheWorkerLoRAManager``): the GPU slots
(``max_loras``, its ``_active_adapters``) and the CPU cache (``max_cpu_loras``, its ``_registered_adapters``). Below
them Quiver keeps the node's disk cache and S3 (vLLM's ``LRUCacheWorkerLoRAManager``, ``vllm/lora/worker_manager.py``). The database and the dashboard say
``hot``/``warm``/``staged``/``cold`` (docs/architecture.md, Vocabulary); ``DB_WORD`` maps between them.
"""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    """Where a version is on a node, fastest first. ``ERRORED`` = its last load there failed."""

    GPU = "gpu"
    CPU = "cpu"
    DISK = "disk"
    COLD = "cold"
    ERRORED = "errored"


# Database / dashboard words (inference.gateway.models.Placement.Tier) for each tier.
DB_WORD: dict[Tier, str] = {
    Tier.GPU: "hot",
    Tier.CPU: "warm",
    Tier.DISK: "staged",
    Tier.COLD: "cold",
    Tier.ERRORED: "errored",
}
FROM_DB_WORD: dict[str, Tier] = {word: tier for tier, word in DB_WORD.items()}

# Served without an engine load: the weights are already in the engine (GPU slot or CPU cache).
IN_ENGINE = frozenset({Tier.GPU, Tier.CPU})


def tier_from_word(word: str) -> Tier:
    """Parse ``gpu``/``cpu``/``disk``/``cold``/``errored`` or the DB words ``hot``/``warm``/``staged``.

    Raises:
        ValueError: an unknown word (the message lists the accepted ones).
    """
    if word in FROM_DB_WORD:
        return FROM_DB_WORD[word]
    try:
        return Tier(word)
    except ValueError:
        accepted = sorted({*(t.value for t in Tier), *FROM_DB_WORD})
        raise ValueError(f"unknown tier {word!r}; use one of {', '.join(accepted)}") from None
