"""Publish this node's engine load to Redis several times a second, for the gateway's admission gate.

Heartbeats (every few seconds, through PostgreSQL) are too slow for admission: the gateway decides on figures no
older than 250 ms (``inference.policy.admission``). So the agent scrapes its engine's ``/metrics`` every
``QUIVER_LOAD_PUBLISH_MS`` (default 100 ms), keeps only the few admission gauges, and writes them as one small JSON
value under ``quiver:node:load:<node name>`` (expiring after 5 s, so a dead agent's figures vanish). Every gateway
process reads those keys in the background (``inference.gateway.loadboard``). Timestamps are the agent's wall
clock: hosts must run NTP, since clock skew adds to the figures' apparent age.

The scan reads only the lines it needs (a vLLM ``/metrics`` body is ~50 KB, mostly histograms): about a
millisecond per scrape, where a full Prometheus parse costs ten times more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from inference.policy.admission import NodeLoad

logger = logging.getLogger(__name__)
KEY_PREFIX = "quiver:node:load:"
TTL_MS = 5000
_WANTED = ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running",
           "vllm:num_preemptions_total", "vllm:lora_requests_info")
_RUNNING_LORAS = 'running_lora_adapters="'
# A running batch holds at most ``max_loras`` adapters; a longer list is no engine's, and counts as unknown.
MAX_RUNNING_LORAS = 1024
_COUNTS = ("num_requests_waiting", "num_requests_running")
_OPTIONAL_COUNTS = ("waiting_capacity", "waiting_deferred")


def load_key(node_name: str) -> str:
    """The Redis key a node's figures live under."""
    return KEY_PREFIX + node_name


def scan_load(text: str, *, at_s: float, scheduling_policy: str = "fcfs") -> NodeLoad:
    """The admission gauges from a vLLM ``/metrics`` body (names as in ``vllm/v1/metrics/loggers.py``, 0.32).

    KV use is the max over engines; counts are summed; ``waiting_by_reason`` stays None when the engine does not
    export it; ``running_loras`` is the newest ``vllm:lora_requests_info`` series' ``running_lora_adapters`` (None
    without LoRA). Unparseable values are skipped (never raises).

    Args:
        text: the Prometheus text.
        at_s: Unix time the scrape started.
        scheduling_policy: the engine's ``--scheduling-policy``.
    """
    kv = 0.0
    counts = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0, "vllm:num_preemptions_total": 0.0}
    reasons: dict[str, float] = {}
    newest_info: tuple[float, str] | None = None  # (update time, running_lora_adapters) of the newest series
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        head, _, raw = line.rpartition(" ")
        try:
            value = float(raw)
        except ValueError:
            continue
        if not math.isfinite(value):  # NaN or +Inf: int() of a sum raised, and a NaN series hid newer ones
            continue
        name = head.split("{", 1)[0]
        if name == "vllm:lora_requests_info":  # every label set is a series; its value is the update's Unix time
            if newest_info is None or value > newest_info[0]:
                newest_info = (value, head.partition(_RUNNING_LORAS)[2].partition('"')[0])
        elif name == "vllm:kv_cache_usage_perc":
            kv = max(kv, value)
        elif name == "vllm:num_requests_waiting_by_reason":
            reason = head.partition('reason="')[2].partition('"')[0]
            reasons[reason] = reasons.get(reason, 0.0) + value
        elif name in counts:
            counts[name] += value
    return NodeLoad(at_s=at_s, kv_cache_usage_perc=kv, num_requests_waiting=int(counts["vllm:num_requests_waiting"]),
                    num_requests_running=int(counts["vllm:num_requests_running"]),
                    waiting_capacity=int(reasons["capacity"]) if "capacity" in reasons else None,
                    waiting_deferred=int(reasons["deferred"]) if "deferred" in reasons else None,
                    num_preemptions_total=counts["vllm:num_preemptions_total"], scheduling_policy=scheduling_policy,
                    running_loras=None if newest_info is None
                    else tuple(n for n in (p.strip() for p in newest_info[1].split(",")) if n))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_decode(raw: bytes | str | None) -> NodeLoad | None:
    """A published value back into a :class:`NodeLoad`; None for a missing or malformed one.

    Every field is checked, as a heartbeat is (``inference.fleet.heartbeat``): the value comes from a node, and the
    gateway's request path compares and adds these figures, where a string or NaN raised on every request.
    ``running_loras`` that is not a list of strings, or longer than ``MAX_RUNNING_LORAS``, counts as unknown (None).
    """
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not _number(data.get("at_s")):
        return None
    fields = {k: data[k] for k in NodeLoad.__dataclass_fields__ if k in data}
    if not all(_number(fields.get(k, 0)) for k in ("kv_cache_usage_perc", "num_preemptions_total")):
        return None
    if not all(_count(fields.get(k, 0)) for k in _COUNTS):
        return None
    if not all(fields.get(k) is None or _count(fields[k]) for k in _OPTIONAL_COUNTS):
        return None
    if not isinstance(fields.get("scheduling_policy", ""), str):
        return None
    running = fields.get("running_loras")
    if running is not None:
        ok = (isinstance(running, list) and len(running) <= MAX_RUNNING_LORAS
              and all(isinstance(n, str) for n in running))
        fields["running_loras"] = tuple(running) if ok else None
    return NodeLoad(**fields)


class LoadPublisher:
    """Scrape → publish loop; ``last`` holds the newest figures (the agent's ``/metrics`` shows them too).

    Args:
        metrics_text: coroutine returning the engine's ``/metrics`` body.
        redis: a ``redis.asyncio`` client, or None to scrape without publishing.
        node_name: this node's name.
        interval_s: seconds between scrapes.
        scheduling_policy: the engine's ``--scheduling-policy``, published so the gateway knows whether it may
            send ``priority``.
    """

    def __init__(self, metrics_text: Callable[[], Awaitable[str]], redis: Any, node_name: str, *,
                 interval_s: float = 0.1, scheduling_policy: str = "fcfs") -> None:
        self.metrics_text = metrics_text
        self.redis = redis
        self.key = load_key(node_name)
        self.interval_s = interval_s
        self.scheduling_policy = scheduling_policy
        self.last: NodeLoad | None = None
        self.failures = 0
        self.scrape_s = 0.0

    async def publish_once(self) -> NodeLoad | None:
        """One scrape and publish; failures are counted and logged (once per streak), never raised."""
        started = time.time()
        try:
            load = scan_load(await self.metrics_text(), at_s=started, scheduling_policy=self.scheduling_policy)
            self.scrape_s = time.time() - started
            if self.redis is not None:
                await self.redis.set(self.key, json.dumps(asdict(load), separators=(",", ":")), px=TTL_MS)
        except Exception as exc:  # noqa: BLE001 - an engine or Redis blip must not end the loop
            if self.failures == 0:
                logger.warning("agent.load_publish_failed", extra={"error": repr(exc)})
            self.failures += 1
            return None
        self.failures = 0
        self.last = load
        return load

    async def run_forever(self) -> None:
        """Publish every ``interval_s`` until cancelled."""
        while True:
            started = time.monotonic()
            await self.publish_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
