"""The node's side of eviction: which adapters leave the engine's CPU cache, by this node's policy.

The rule is the pure ``inference.policy.node_eviction.node_victims`` (the engine's worker extension and the simulator
call it too); this module builds its residents from the engine's own figures (``inference.node.worker_ext``), keeps
what the engine does not (LFU's decayed request counts, the grace of a fresh load, the busy set of this agent's
loads) and relays the control plane's hints (quota, plan) to the engine, so that a reload inside the engine ranks
victims as the agent does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.policy.eviction import AllPinnedError, EvictionConfig, EvictionPolicy, decayed_hits
from inference.policy.node_eviction import (
    HINTS_STALE_HEARTBEATS,
    NodeResident,
    hints_current,
    is_fresh,
    node_victims,
)

logger = logging.getLogger(__name__)

# LFU records kept for adapters the engine no longer holds (a few MB at most; ids are AdapterVersion pks).
HITS_KEPT = 65536


def _ids(answer: dict[str, Any], key: str) -> frozenset[int] | None:
    ids = answer.get(key)
    if not isinstance(ids, list) or len(ids) > 10_000:
        return None
    return frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool))


class Evictor:
    """Makes room in the engine's CPU cache by this node's eviction policy.

    Args:
        settings: node settings (``eviction_policy``, ``eviction_grace_s``, ``max_cpu_loras``, ``heartbeat_seconds``).
        engine: HTTP client for the engine.
        busy: whether an adapter (by served name) has a load or effect probe in progress on this agent.
    """

    def __init__(self, settings: NodeSettings, engine: EngineHTTPClient, busy: Callable[[str], bool]) -> None:
        self.settings = settings
        self.engine = engine
        self._busy = busy
        self.config = EvictionConfig(policy=EvictionPolicy(settings.eviction_policy))
        # One policy change in the engine at a time: an operator's switch, or a state read's sync. Without it a state
        # read between the engine applying a switch and its answer sent the old policy back (agent lfu, engine lru).
        self._policy_lock = asyncio.Lock()
        # lora_int_id -> time.monotonic() of its last good add here, and the engine's request count for it right
        # after that add: the eviction grace (`eviction_grace_s`, ``node_eviction.is_fresh``).
        self._loaded_at: dict[int, float] = {}
        self._requests_at_load: dict[int, float] = {}
        # lora_int_id -> (decayed requests, monotonic time of that figure, the engine's request total then).
        self._hits: dict[int, tuple[float, float, float]] = {}
        # (monotonic time, planned on other nodes only, tenants at or over quota) of the last heartbeat answer.
        self._hints: tuple[float, frozenset[int], frozenset[int]] = (-1e18, frozenset(), frozenset())
        self._relay: asyncio.Task[None] | None = None

    def note_plan(self, answer: dict[str, Any]) -> None:
        """Keep a heartbeat answer's hints (``inference.fleet.internal_views.heartbeat``): ``elsewhere``, the
        adapters the control plane's plan puts on other nodes only, and ``over_quota``, those of tenants at or over
        their residency quota; then relay them to the engine's workers (``relay_hints``) in the background. Anything
        but a list of ints is ignored (at most 10,000, the heartbeat's own limit)."""
        elsewhere, over_quota = _ids(answer, "elsewhere"), _ids(answer, "over_quota")
        if elsewhere is None and over_quota is None:
            return
        self._hints = (time.monotonic(), elsewhere or frozenset(), over_quota or frozenset())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test's direct call): the next answer relays
        if self._relay is None or self._relay.done():
            self._relay = loop.create_task(self.relay_hints())

    async def relay_hints(self) -> None:
        """Send the current hints to the engine's workers (``/quiver/v1/eviction_hints``), valid for
        ``HINTS_STALE_HEARTBEATS`` heartbeats; an engine that cannot take them is logged and ranks by policy alone."""
        _, elsewhere, over_quota = self._hints
        try:
            await self.engine.set_eviction_hints(over_quota=sorted(over_quota), elsewhere=sorted(elsewhere),
                                                 valid_s=HINTS_STALE_HEARTBEATS * self.settings.heartbeat_seconds)
        except EngineError as exc:
            logger.warning("agent.eviction_hints_not_set", extra={"error": exc.detail})

    def note_loaded(self, lora_int_id: int, *, at: float, requests: float | None) -> None:
        """Start the eviction grace of a good add: made at ``at`` (``time.monotonic()``), with ``requests`` the
        engine's request count for it right after (None when the engine did not report it)."""
        self._loaded_at[lora_int_id] = at
        if requests is not None:
            self._requests_at_load[lora_int_id] = requests

    def hints(self, now: float) -> tuple[frozenset[int], frozenset[int]]:
        """``(planned elsewhere, over quota)`` from the last answer, or empty sets once it is more than
        ``HINTS_STALE_HEARTBEATS`` heartbeats old."""
        at, elsewhere, over_quota = self._hints
        if not hints_current(age_s=now - at, heartbeat_s=self.settings.heartbeat_seconds):
            return frozenset(), frozenset()
        return elsewhere, over_quota

    def decayed_requests(self, requests: dict[int, float], now: float) -> dict[int, float]:
        """LFU's counts with decay: each adapter's requests, halving every ``EvictionConfig.half_life_s`` (600 s, as
        the simulator and the worker extension), so traffic that has moved away stops keeping an adapter in the
        cache. The requests since the last call count in full at ``now``; the first sight of an adapter counts all.

        An adapter absent from ``requests`` (removed from the engine) keeps its record: the engine's counts are
        all-time (``inference.node.worker_ext``), so forgetting it would let a re-added adapter count every request
        it ever had undecayed. Past ``HITS_KEPT`` records the longest-unseen go."""
        out = {}
        for i, total in requests.items():
            seen = self._hits.get(i)
            if seen is None or total < seen[2]:
                value = total
            else:
                value = decayed_hits(seen[0], seen[1], now, self.config.half_life_s) + (total - seen[2])
            self._hits[i] = (value, now, total)
            out[i] = value
        if len(self._hits) > HITS_KEPT:
            for i in sorted(self._hits, key=lambda k: self._hits[k][1])[: len(self._hits) - HITS_KEPT]:
                del self._hits[i]
        return out

    async def make_room(self, lora_int_id: int) -> tuple[str, ...]:
        """Drop from the engine's CPU cache the adapters ``node_victims`` picks when it is full and ``lora_int_id``
        is not in it (``evict_lora``: their names stay served, reloaded from disk on their next request, as after
        vLLM's own LRU eviction). Without the worker's lists (no extension), vLLM's LRU decides, as before.

        Residents come from the engine's own figures (``inference.node.worker_ext``): recency = seconds since its
        last batch, frequency = requests that used it (decayed), reload cost = ``disk_reload_ms``; busy = a load or
        probe of it in progress here; the hints = the control plane's last answer.

        Returns:
            The served names dropped from the engine's CPU cache.

        Raises:
            EngineError: 409 `all_pinned` when every resident is pinned (vLLM would raise the same).
        """
        report = await self.engine.loras_report()
        residency = report.get("residency")
        if not residency:
            return ()
        cpu = [int(i) for i in residency.get("cpu", [])]
        capacity = int(residency.get("max_cpu_loras") or self.settings.max_cpu_loras)
        if lora_int_id in cpu or len(cpu) < capacity:
            return ()
        names = {int(lora["lora_int_id"]): lora["lora_name"] for lora in report.get("loras", [])}
        sizes = {int(k): int(v) for k, v in residency.get("bytes", {}).items()}
        idle = {int(k): float(v) for k, v in residency.get("idle_s", {}).items()}
        # An engine without request counts (an older extension) reports scheduler steps only.
        counts = {int(k): float(v) for k, v in (residency.get("requests") or residency.get("steps") or {}).items()}
        pinned = {int(i) for i in residency.get("pinned", [])}
        now = time.monotonic()
        hits = self.decayed_requests(counts, now)
        elsewhere, over_quota = self.hints(now)
        grace = self.settings.eviction_grace_s
        residents = [NodeResident(
            version_id=i, size_bytes=sizes.get(i, 0), pinned=i in pinned, idle_s=idle.get(i, 1e12),
            requests=hits.get(i, 0.0), served=i in names,
            # A load or effect probe in progress here: removing its name while its probe request runs makes vLLM
            # re-add the weights for that batch, a copy no name serves (vllm#54839).
            busy=i in names and self._busy(names[i]),
            fresh=is_fresh(loaded_ago_s=now - self._loaded_at.get(i, -1e18),
                           requests_since_load=counts.get(i, 0.0) - self._requests_at_load.get(i, float("inf")),
                           idle_s=idle.get(i, 1e12), grace_s=grace),
            planned_elsewhere=i in elsewhere, tenant_over_quota=i in over_quota) for i in cpu]
        try:
            victims = node_victims(residents, capacity=capacity, now_s=now, config=self.config)
        except AllPinnedError as exc:
            raise EngineError(409, "all_pinned", f"every adapter in the engine's CPU cache is pinned: {exc}") from exc
        removed = []
        for victim in victims:
            name = names.get(victim)
            if name is None:
                continue  # not removable by name; vLLM's LRU takes it
            try:
                # Out of the cache, name kept: a gateway that still routes here gets a reload from disk, not a 404.
                await self.engine.evict_lora(name)
            except EngineError as exc:
                if exc.code != "lora_not_found":
                    raise
            self._loaded_at.pop(victim, None)
            self._requests_at_load.pop(victim, None)
            removed.append(name)
        if removed:
            logger.info("agent.evicted", extra={"lora_names": removed, "policy": self.config.policy.value,
                                                "for_lora_int_id": lora_int_id,
                                                "over_quota": sorted(set(victims) & over_quota)})
        return tuple(removed)

    async def set_policy(self, config: EvictionConfig) -> None:
        """Rank by ``config`` from now on, here and in the engine's workers (the engine first).

        Raises:
            EngineError: the engine refused or could not be reached; the policy is unchanged then.
        """
        async with self._policy_lock:
            await self.engine.set_eviction_policy(config.policy.value)
            self.config = config

    async def sync_engine_policy(self, engine_residency: dict[str, Any] | None) -> None:
        """Send the agent's policy to an engine that ranks by another (its own environment's, or its default after
        a restart), so that a reload inside the engine picks the victim the agent would; ``engine_residency``
        (the engine's report) is corrected in place once the engine took it."""
        engine_policy = ((engine_residency or {}).get("eviction") or {}).get("policy")
        if engine_policy is None or engine_policy == self.config.policy.value:
            return
        async with self._policy_lock:
            # Compared again under the lock: a switch that was in flight when the engine was read has finished, and
            # the engine then reported the policy it set (the agent's own now).
            if engine_policy == self.config.policy.value:
                return
            try:
                await self.engine.set_eviction_policy(self.config.policy.value)
            except EngineError as exc:
                logger.warning("agent.eviction_policy_not_set", extra={"error": exc.detail})
                return
        engine_residency["eviction"]["policy"] = self.config.policy.value  # type: ignore[index]
        logger.info("agent.eviction_policy_sent", extra={"policy": self.config.policy.value,
                                                          "engine_had": engine_policy})
