"""The node's side of eviction: which adapters leave the engine's CPU cache, by this node's policy.

The ranking itself is the pure ``inference.policy.eviction.choose_victims``; this module builds its residents from
the engine's own figures (``inference.node.worker_ext``), keeps what the engine does not (LFU's decayed counts, the
grace of a fresh load, the control plane's plan hint) and keeps the engine's own policy in step with the agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.policy.eviction import (
    AllPinnedError,
    EvictionConfig,
    EvictionPolicy,
    Resident,
    choose_victims,
    decayed_hits,
    disk_reload_ms,
)

logger = logging.getLogger(__name__)

# An adapter used this recently (seconds since its last batch) may still have a request decoding.
GRACE_BUSY_S = 1.0
# An adapter the plan puts elsewhere is ranked undesired once idle here this long (seconds; a few requests' time).
ELSEWHERE_IDLE_S = 5.0
# The plan hint counts while the last answer is at most this many heartbeats old.
PLAN_STALE_HEARTBEATS = 3
# LFU records kept for adapters the engine no longer holds (a few MB at most; ids are AdapterVersion pks).
HITS_KEPT = 65536


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
        # lora_int_id -> time.monotonic() of its last good add here, and the engine's scheduler steps for it right
        # after that add (its effect probe included): the eviction grace (`eviction_grace_s`) lasts until either
        # runs out, i.e. until the request that asked for the load has run.
        self._loaded_at: dict[int, float] = {}
        self._steps_at_load: dict[int, float] = {}
        # lora_int_id -> (decayed steps, monotonic time of that figure, the engine's step total then): LFU's counts.
        self._hits: dict[int, tuple[float, float, float]] = {}
        # (monotonic time, lora_int_ids) of the control plane's last heartbeat answer: adapters planned elsewhere.
        self._elsewhere: tuple[float, frozenset[int]] = (-1e18, frozenset())

    def note_plan(self, answer: dict[str, Any]) -> None:
        """Keep a heartbeat answer's ``elsewhere`` (``inference.fleet.internal_views.heartbeat``): the adapters
        the control plane's plan puts on other nodes only. Anything but a list of ints is ignored (at most 10,000,
        the heartbeat's own limit)."""
        ids = answer.get("elsewhere")
        if not isinstance(ids, list) or len(ids) > 10_000:
            return
        self._elsewhere = (time.monotonic(),
                           frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool)))

    def note_loaded(self, lora_int_id: int, *, at: float, steps: float | None) -> None:
        """Start the eviction grace of a good add: made at ``at`` (``time.monotonic()``), with ``steps`` the
        engine's scheduler steps for it right after (None when the engine did not report them)."""
        self._loaded_at[lora_int_id] = at
        if steps is not None:
            self._steps_at_load[lora_int_id] = steps

    def planned_elsewhere(self, idle: dict[int, float], now: float) -> frozenset[int]:
        """The residents to rank as undesired: planned on other nodes only (the last answer, if at most
        ``PLAN_STALE_HEARTBEATS`` heartbeats old) and idle here for ``ELSEWHERE_IDLE_S`` or more — one still in
        use here keeps its rank, so spill-over and a round-robin router are not made to thrash."""
        at, ids = self._elsewhere
        if now - at > PLAN_STALE_HEARTBEATS * self.settings.heartbeat_seconds:
            return frozenset()
        return frozenset(i for i in ids if idle.get(i, 1e12) >= ELSEWHERE_IDLE_S)

    def decayed_steps(self, steps: dict[int, float], now: float) -> dict[int, float]:
        """LFU's counts with decay: each adapter's scheduler steps, halving every ``EvictionConfig.half_life_s``
        (600 s, as the simulator), so traffic that has moved away stops keeping an adapter in the cache. The steps
        since the last call count in full at ``now``; the first sight of an adapter counts all its steps.

        An adapter absent from ``steps`` (removed from the engine) keeps its record: the engine's step counts are
        all-time (``inference.node.worker_ext``), so forgetting it would let a re-added adapter count every step it
        ever ran undecayed and hold the slot against the traffic that replaced it. Past ``HITS_KEPT`` records the
        longest-unseen go."""
        out = {}
        for i, total in steps.items():
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
        """Drop from the engine's CPU cache the adapters ``choose_victims`` picks when it is full and ``lora_int_id``
        is not in it (``evict_lora``: their names stay served, reloaded from disk on their next request, as after
        vLLM's own LRU eviction). Without the worker's lists (no extension), vLLM's LRU decides, as before.

        Residents come from the engine's own figures (``inference.node.worker_ext``): recency = seconds since its
        last batch, frequency = scheduler steps that used it, reload cost = ``disk_reload_ms``.
        Adapters added here less than ``eviction_grace_s`` ago and not used since are left out while another
        unpinned one can go. Adapters the control plane's plan puts on other nodes only and idle here go before
        the policy's ranking (``planned_elsewhere``).

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
        steps = {int(k): float(v) for k, v in residency.get("steps", {}).items()}
        pinned = {int(i) for i in residency.get("pinned", [])}
        clock = time.monotonic()
        hits = self.decayed_steps(steps, clock)
        elsewhere = self.planned_elsewhere(idle, clock)
        # Undesired (first to go): an id no name serves (garbage), or one the plan moved to other nodes.
        residents = [Resident(version_id=i, tenant_id=0, size_bytes=sizes.get(i, 0), pinned=i in pinned,
                              last_used_s=-idle.get(i, 1e12), hits=hits.get(i, 0.0), hits_at_s=clock,
                              reload_ms=disk_reload_ms(sizes.get(i, 0)),
                              desired=i in names and i not in elsewhere)
                     for i in cpu]
        # An adapter whose own load or effect probe is in progress here is not a victim: removing its name while its
        # probe request runs makes vLLM re-add the weights for that batch, a copy no name serves (vllm#54839).
        busy = {i for i in cpu if i in names and self._busy(names[i])}
        if capacity - len(busy) < 1:
            return ()  # every resident is mid-load: vLLM's LRU decides
        residents = [r for r in residents if r.version_id not in busy]
        now = time.monotonic()
        # Fresh: added within the grace and either not used since (steps still at the post-load baseline) or in a
        # batch within the last second (its request may still be decoding). Once its request is done it is ranked
        # like any other: a time-only grace kept each new cold adapter and evicted a hot one instead (bench_fleet,
        # 16 adapters over 8 slots).
        fresh = {r.version_id for r in residents if not r.pinned
                 and now - self._loaded_at.get(r.version_id, -1e18) < self.settings.eviction_grace_s
                 and (steps.get(r.version_id, 0.0) <= self._steps_at_load.get(r.version_id, float("inf"))
                      or idle.get(r.version_id, 1e12) < GRACE_BUSY_S)}
        try:
            victims: Sequence[int] = ()
            if fresh and capacity - len(busy) - len(fresh) >= 1:
                # Older residents go first; if only pins are left among them, the fresh ones are fair game again.
                with contextlib.suppress(AllPinnedError):
                    victims = choose_victims([r for r in residents if r.version_id not in fresh],
                                             slots=capacity - len(busy) - len(fresh), budget_bytes=None,
                                             incoming_bytes=0, now_s=clock, config=self.config)
            if not victims:
                victims = choose_victims(residents, slots=capacity - len(busy), budget_bytes=None, incoming_bytes=0,
                                         now_s=clock, config=self.config)
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
            self._steps_at_load.pop(victim, None)
            removed.append(name)
        if removed:
            logger.info("agent.evicted", extra={"lora_names": removed, "policy": self.config.policy.value,
                                                "for_lora_int_id": lora_int_id})
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
