"""The node's disk side as the agent drives it: staging a version's files from S3, and the disk cache's byte budget.

``AdapterCache`` (``inference.node.cache``) does the blocking work; these run it in threads, and the budget asks the
engine first which staged folders it may still read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

from inference.node.cache import AdapterCache, CacheError, FileSpec, StagedAdapter
from inference.node.engine_client import EngineError, EngineHTTPClient

logger = logging.getLogger(__name__)


async def stage_files(cache: AdapterCache, lora_name: str, lora_int_id: int, files: Sequence[FileSpec]) -> StagedAdapter:
    """Download and verify a version's files into the disk cache (files already there and intact are reused).

    Raises:
        CacheError: as ``AdapterCache.stage`` (logged here as ``agent.stage_failed``).
    """
    try:
        return await asyncio.to_thread(cache.stage, lora_name, lora_int_id, list(files))
    except CacheError as exc:
        logger.warning(
            "agent.stage_failed",
            extra={"lora_name": lora_name, "lora_int_id": lora_int_id, "code": exc.code},
        )
        raise


async def enforce_disk_budget(
    cache: AdapterCache,
    engine: EngineHTTPClient,
    locks: defaultdict[str, asyncio.Lock],
    keep: set[tuple[str, int]],
    *,
    forget: Callable[[str], None],
) -> None:
    """Trim the disk cache to its byte budget (LRU), keeping what the engine holds in its CPU cache.

    A version served by name but out of the engine's cache (evicted to make room: the engine would reload it
    from these files) may go: its name is removed from the engine first, so its next request is a 404 the
    gateway re-routes, never a load from a deleted path.

    Args:
        cache: the disk cache.
        engine: HTTP client for the engine.
        locks: the agent's one lock per served name, taken while a name is removed.
        keep: ``(lora_name, lora_int_id)`` never deleted (the version just loaded).
        forget: called with each name removed from the engine, under its lock.
    """
    if cache.max_bytes is None:
        return
    try:
        served = await engine.list_loras()
    except EngineError as exc:
        logger.warning("agent.budget_skipped", extra={"error": exc.detail})
        return  # without the engine's list, deleting could pull files from under a served adapter
    keep |= {(lora["lora_name"], int(lora["lora_int_id"])) for lora in served if lora.get("in_engine", True)}
    by_name = {lora["lora_name"]: int(lora["lora_int_id"]) for lora in served}
    victims = await asyncio.to_thread(cache.over_budget, keep)
    for entry in victims:
        if by_name.get(entry.lora_name) != entry.lora_int_id:
            continue
        async with locks[entry.lora_name]:
            try:
                await engine.remove_lora(entry.lora_name)
            except EngineError as exc:
                if exc.code != "lora_not_found":
                    logger.warning("agent.budget_skipped", extra={"error": exc.detail})
                    return
            forget(entry.lora_name)
    await asyncio.to_thread(cache.delete, victims)
