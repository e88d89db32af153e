"""Engine control the agent's operations share: adding a version (swapping one served under the same name), and
reading where the engine holds an adapter right now."""

from __future__ import annotations

import logging
from typing import Any

from inference.node.engine_client import EngineError, EngineHTTPClient

logger = logging.getLogger(__name__)

#: The engine's tier names (``inference.node.worker_ext``) in the residency words of the database and dashboard.
ENGINE_TIER_WORD = {"gpu": "hot", "cpu": "warm", "disk": "staged"}


async def add_lora_swapping(
    engine: EngineHTTPClient, lora_name: str, lora_int_id: int, lora_path: str, *, pin: bool
) -> dict[str, Any]:
    """``add_lora`` (and ``pin_lora`` if ``pin``); a name served under another id (a new AdapterVersion behind the
    same name) is removed first, then added again.

    Raises:
        EngineError: as ``EngineHTTPClient.add_lora`` / ``remove_lora``.
    """
    try:
        return await engine.add_lora(lora_name, lora_int_id, lora_path, pin=pin)
    except EngineError as exc:
        if exc.code != "lora_name_conflict":
            raise
    # Same name, other id: swap versions (remove the old id so its CPU slot and pin are freed).
    logger.info("agent.version_swap", extra={"lora_name": lora_name, "lora_int_id": lora_int_id})
    await engine.remove_lora(lora_name)
    return await engine.add_lora(lora_name, lora_int_id, lora_path, pin=pin)


async def engine_tier(engine: EngineHTTPClient, lora_int_id: int) -> tuple[str, float | None]:
    """The adapter's tier in the engine's own lists now (`hot`/`warm`; `warm` when they cannot be read), and the
    engine's request count for it (scheduler steps from an engine that counts no requests; None when not reported):
    the eviction grace's baseline after a load."""
    try:
        report = await engine.loras_report()
    except EngineError:
        return "warm", None
    residency = report.get("residency") or {}
    steps = residency.get("requests") or residency.get("steps") or {}
    baseline = None
    if str(lora_int_id) in steps or lora_int_id in steps:
        baseline = float(steps.get(str(lora_int_id), steps.get(lora_int_id, 0)))
    for lora in report.get("loras", []):
        if int(lora["lora_int_id"]) == lora_int_id and lora.get("tier") in ("gpu", "cpu"):
            return ENGINE_TIER_WORD[lora["tier"]], baseline
    return "warm", baseline
