"""The agent's state report (``GET /v1/state``, also the heartbeat body), read from the engine's own LoRA manager.

Residency words (``docs/placement.md``, "True residency"), read from the engine's own lists
(`inference.node.worker_ext`, through `engine_ext`): `hot` = in one of the `max_loras` GPU slots; `warm` = in the
engine's CPU cache only (`max_cpu_loras`); `staged` = complete on this node's disk but not in the engine (never
loaded, unloaded, or evicted by the engine's LRU); `errored` = its last load here failed. Without the worker
extension the agent falls back to the old signal (`hot` = a request in flight, `vllm:lora_requests_info`) and says
so in `residency.source`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from inference.node.cache import AdapterCache
from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.node.engine_control import ENGINE_TIER_WORD
from inference.node.metrics import EngineMetrics, parse_engine_metrics

logger = logging.getLogger(__name__)


def served_tier(lora: dict[str, Any], hot: set[str]) -> str:
    """Residency of a served adapter.

    From the engine's lists when the extension reports them (`tier` = `gpu`/`cpu`/`disk`). Otherwise `hot` if a
    request is in flight; `warm` if in the engine's CPU cache; else `staged`: the engine's LRU (`max_cpu_loras`,
    `LRUCacheWorkerLoRAManager.add_adapter` in `vllm/lora/worker_manager.py`) evicted it, and the name stays
    served, but its next request reloads it from disk.
    """
    if lora.get("tier") in ENGINE_TIER_WORD:
        return ENGINE_TIER_WORD[lora["tier"]]
    if lora["lora_name"] in hot:
        return "hot"
    return "warm" if lora["in_engine"] else "staged"


async def _metrics(engine: EngineHTTPClient) -> EngineMetrics | None:
    try:
        return parse_engine_metrics(await engine.metrics_text())
    except (EngineError, ValueError) as exc:
        logger.warning("agent.metrics_unavailable", extra={"error": str(exc)})
        return None


async def state_report(
    settings: NodeSettings,
    engine: EngineHTTPClient,
    cache: AdapterCache,
    *,
    errored: Mapping[str, tuple[int, str]],
    effects: Mapping[str, tuple[int, str]],
    on_engine_residency: Callable[[dict[str, Any] | None], Awaitable[None]],
) -> dict[str, Any]:
    """The `GET /v1/state` report (also the heartbeat body).

    Args:
        settings: node settings.
        engine: HTTP client for the engine.
        cache: the disk cache.
        errored: lora_name -> (lora_int_id, error code) of its last failed load here.
        effects: lora_name -> (lora_int_id, effect probe verdict) of its last good load here.
        on_engine_residency: awaited with the engine's residency report as soon as it is read (the agent syncs
            its eviction policy there, and may correct the report in place).

    Returns:
        `{"node", "healthy", "base_model", "engine_url", "agent_url", "max_loras", "max_cpu_loras",
        "max_lora_rank", "adapters": [{"lora_name", "lora_int_id", "tier", "pinned", "served", "bytes"}],
        "residency": {"source", "gpu", "cpu", "disk", "errored", "pinned", "gpu_bytes", "cpu_bytes",
        "disk_bytes", "gpu_slot_bytes"}, "kv_cache_usage_perc", "num_requests_running",
        "num_requests_waiting", "num_preemptions_total"}`. Tiers are the DB words (`hot` = GPU slot, `warm` =
        CPU cache only, `staged` = disk, `errored`); `residency` counts adapters per tier (`cpu` excludes the
        GPU-resident ones), `gpu_bytes` = GPU residents × the rank-padded slot size, `cpu_bytes` = every CPU
        copy (vLLM keeps one for GPU residents too), `disk_bytes` = staged files; `source` is `engine` when
        the worker's own lists were read, `activity` when the agent fell back to in-flight requests. Engine
        figures are null when the engine cannot be read.
    """
    healthy = await engine.health()
    served: list[dict[str, Any]] = []
    engine_residency: dict[str, Any] | None = None
    metrics: EngineMetrics | None = None
    if healthy:
        try:
            report = await engine.loras_report()
            served = list(report.get("loras", []))
            engine_residency = report.get("residency")
            await on_engine_residency(engine_residency)
        except EngineError as exc:
            logger.warning("agent.list_loras_failed", extra={"error": exc.detail})
            healthy = False
        metrics = await _metrics(engine)
    hot = metrics.hot_lora_names if metrics else set()
    adapters: list[dict[str, Any]] = []
    served_keys = set()
    loads = {int(k): int(v) for k, v in (engine_residency or {}).get("loads", {}).items()}
    for lora in served:
        lora_id = int(lora["lora_int_id"])
        served_keys.add((lora["lora_name"], lora_id))
        report_entry: dict[str, Any] = {
            "lora_name": lora["lora_name"],
            "lora_int_id": lora_id,
            "tier": served_tier(lora, hot),
            "pinned": bool(lora["pinned"]),
            "served": True,
            "bytes": int(lora.get("bytes") or 0),
            "loads": loads.get(lora_id, 0),
        }
        effect = effects.get(lora["lora_name"])
        if effect is not None and effect[0] == lora_id:
            report_entry["effect"] = effect[1]
        adapters.append(report_entry)
    staged = await asyncio.to_thread(cache.staged)
    disk_bytes = await asyncio.to_thread(lambda: {(e.lora_name, e.lora_int_id): _dir_bytes(e.path) for e in staged})
    served_names = {name for name, _ in served_keys}
    for entry in staged:
        if (entry.lora_name, entry.lora_int_id) not in served_keys:
            adapters.append(
                {
                    "lora_name": entry.lora_name,
                    "lora_int_id": entry.lora_int_id,
                    "tier": "staged",
                    "pinned": False,
                    "served": False,
                    "bytes": disk_bytes[(entry.lora_name, entry.lora_int_id)],
                }
            )
    for name, (lora_int_id, code) in errored.items():
        if name not in served_names:
            adapters = [a for a in adapters if a["lora_name"] != name]
            adapters.append({"lora_name": name, "lora_int_id": lora_int_id, "tier": "errored",
                             "pinned": False, "served": False, "bytes": 0, "error_code": code})
    adapters.sort(key=lambda a: (a["lora_name"], a["lora_int_id"]))
    s = settings
    return {
        "node": s.node_name,
        "healthy": healthy,
        "base_model": s.base_model,
        "engine_url": s.engine_url,
        "agent_url": s.agent_url,
        "max_loras": s.max_loras,
        "max_cpu_loras": s.max_cpu_loras,
        "max_lora_rank": s.max_lora_rank,
        "adapters": adapters,
        "residency": residency_summary(adapters, engine_residency, sum(disk_bytes.values())),
        "kv_cache_usage_perc": metrics.kv_cache_usage_perc if metrics else None,
        "num_requests_running": metrics.num_requests_running if metrics else None,
        "num_requests_waiting": metrics.num_requests_waiting if metrics else None,
        "num_preemptions_total": metrics.num_preemptions_total if metrics else None,
    }


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def residency_summary(adapters: list[dict[str, Any]], engine: dict[str, Any] | None, disk_bytes: int) -> dict[str, Any]:
    """Counts and bytes per tier for the state report (see `state_report`).

    Args:
        adapters: the report's adapter entries.
        engine: the worker's residency (`engine_ext.engine_residency`), None when unavailable.
        disk_bytes: bytes of every staged version on this node's disk.
    """
    tiers = [a["tier"] for a in adapters]
    slot_bytes = int(engine.get("slot_bytes", 0)) if engine else 0
    gpu = tiers.count("hot")
    return {
        "source": "engine" if engine is not None else "activity",
        "gpu": gpu,
        "cpu": tiers.count("warm"),
        "disk": tiers.count("staged"),
        "errored": tiers.count("errored"),
        "pinned": sum(1 for a in adapters if a["pinned"]),
        "gpu_bytes": gpu * slot_bytes,
        "cpu_bytes": sum(int(v) for v in engine.get("bytes", {}).values()) if engine else 0,
        "disk_bytes": disk_bytes,
        "gpu_slot_bytes": slot_bytes,
        "loads_total": int(engine.get("loads_total", 0)) if engine else None,
        # Seconds of the engine's steps spent moving adapters: what residency can save on this node.
        "move_seconds": round(sum(float((engine.get("moves") or {}).get(k, 0.0))
                                  for k in ("disk_to_cpu_s", "cpu_to_gpu_s")), 6) if engine else None,
    }
