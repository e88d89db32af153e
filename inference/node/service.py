"""The node agent's operations: stage + load, unload, pin, and the state report.

Residency words (shared/notes/conventions.md, Vocabulary), read from the engine's own LoRA manager
(`inference.node.worker_ext`, through `engine_ext`): `hot` = in one of the `max_loras` GPU slots; `warm` = in the
engine's CPU cache only (`max_cpu_loras`); `staged` = complete on this node's disk but not in the engine (never
loaded, unloaded, or evicted by the engine's LRU); `errored` = its last load here failed. Without the worker
extension the agent falls back to the old signal (`hot` = a request in flight, `vllm:lora_requests_info`) and says
so in `residency.source`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference.policy.eviction import (
    AllPinnedError,
    EvictionConfig,
    EvictionPolicy,
    Resident,
    choose_victims,
    decayed_hits,
    disk_reload_ms,
)
from inference.node.cache import AdapterCache, CacheError, FileSpec
from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.node.metrics import EngineMetrics, parse_engine_metrics

logger = logging.getLogger(__name__)


class AgentError(Exception):
    """An error answer: `{"detail", "code"}` with `status`."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class LoadResult:
    """What `POST /v1/adapters/load` answers.

    Attributes:
        lora_name: served name.
        lora_int_id: engine id (AdapterVersion pk).
        pinned: whether the engine pins it now.
        download_ms: staging time in ms (verification of reused files included).
        load_ms: engine `add_lora` (+ `pin_lora`) time in ms.
        tier: where the engine holds it right after the load (`hot` = GPU slot, `warm` = CPU cache), read from
            the engine's own lists (vLLM's `add_lora` activates into a GPU slot, so usually `hot`).
        effect: the effect probe's verdict (`NodeAgent.probe_effect`): `changed`, `no_effect`, `unknown` (the
            probe failed) or `unchecked` (probe off).
        evicted: names the agent dropped from the engine's CPU cache to make room (its eviction policy's choice);
            they stay served by name, and their next request reloads them from disk.
    """

    lora_name: str
    lora_int_id: int
    pinned: bool
    download_ms: float
    load_ms: float
    tier: str = "warm"
    effect: str = "unchecked"
    evicted: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The contract's response body."""
        return {
            "lora_name": self.lora_name,
            "lora_int_id": self.lora_int_id,
            "tier": self.tier,
            "pinned": self.pinned,
            "download_ms": round(self.download_ms, 3),
            "load_ms": round(self.load_ms, 3),
            "effect": self.effect,
            "evicted": list(self.evicted),
        }


# The effect probe (issue 6 §5): a fixed prompt, a few greedy tokens, each chosen token's logprob compared.
PROBE_PROMPT = "The quick brown fox jumps over the lazy dog and"
PROBE_TOKENS = 4
# An adapter that adds exact zeros leaves fp32 logprobs bit-identical; batching noise stays far below this.
PROBE_TOLERANCE = 1e-4
# An adapter used this recently (seconds since its last batch) may still have a request decoding.
GRACE_BUSY_S = 1.0
# An adapter the plan puts elsewhere is ranked undesired once idle here this long (seconds; a few requests' time).
ELSEWHERE_IDLE_S = 5.0
# The plan hint counts while the last answer is at most this many heartbeats old.
PLAN_STALE_HEARTBEATS = 3
# LFU records kept for adapters the engine no longer holds (a few MB at most; ids are AdapterVersion pks).
HITS_KEPT = 65536


ENGINE_TIER_WORD = {"gpu": "hot", "cpu": "warm", "disk": "staged"}


def _tier(lora: dict[str, Any], hot: set[str]) -> str:
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


class NodeAgent:
    """Coordinates the disk cache and the engine for one node.

    Args:
        settings: node settings.
        cache: the adapter cache (blocking; run in threads here).
        engine: HTTP client for the engine.
    """

    def __init__(self, settings: NodeSettings, cache: AdapterCache, engine: EngineHTTPClient) -> None:
        self.settings = settings
        self.cache = cache
        self.engine = engine
        # One in-flight operation per lora_name: concurrent loads of one adapter must not race on disk.
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # lora_name -> (lora_int_id, error code) of its last failed load here; cleared by a good load or unload.
        self.errored: dict[str, tuple[int, str]] = {}
        # lora_name -> (lora_int_id, effect probe verdict) of its last good load here.
        self.effects: dict[str, tuple[int, str]] = {}
        # Making room and adding happen one at a time: two loads must not pick each other's adapters as victims.
        self._room = asyncio.Lock()
        self._base_probe: tuple[list[int], list[float]] | None = None
        # Effect probe verdicts by weights (the files' sha256s, sorted): the same weights on the same base (this
        # agent serves one) always give the same verdict, so a reload after an eviction skips the probe's two
        # greedy requests. `unknown` (the probe failed) is not kept.
        self._verdicts: dict[tuple[str, ...], str] = {}
        self.eviction = EvictionConfig(policy=EvictionPolicy(settings.eviction_policy))
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
        """Keep a heartbeat answer's ``elsewhere`` (``inference.gateway.internal_views.heartbeat``): the adapters
        the control plane's plan puts on other nodes only. Anything but a list of ints is ignored (at most 10,000,
        the heartbeat's own limit)."""
        ids = answer.get("elsewhere")
        if not isinstance(ids, list) or len(ids) > 10_000:
            return
        self._elsewhere = (time.monotonic(),
                           frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool)))

    def _planned_elsewhere(self, idle: dict[int, float], now: float) -> frozenset[int]:
        """The residents to rank as undesired: planned on other nodes only (the last answer, if at most
        ``PLAN_STALE_HEARTBEATS`` heartbeats old) and idle here for ``ELSEWHERE_IDLE_S`` or more — one still in
        use here keeps its rank, so spill-over and a round-robin router are not made to thrash."""
        at, ids = self._elsewhere
        if now - at > PLAN_STALE_HEARTBEATS * self.settings.heartbeat_seconds:
            return frozenset()
        return frozenset(i for i in ids if idle.get(i, 1e12) >= ELSEWHERE_IDLE_S)

    async def load(
        self, lora_name: str, lora_int_id: int, files: Sequence[FileSpec], *, pin: bool, expect_effect: bool = True
    ) -> LoadResult:
        """Stage the files, make room by this node's eviction policy, `add_lora` with `lora_int_id` (and
        `pin_lora` if asked), then probe that the adapter changes the output.

        Idempotent: an adapter already served under the same id answers 200 again. If `lora_name` is
        served under another id (a new AdapterVersion behind the same name), the old one is removed
        from the engine first, then the new one is added. When the engine's CPU cache is full, the agent removes
        the adapter ``choose_victims`` picks (``QUIVER_EVICTION_POLICY``) before vLLM's LRU would pick one.

        Args:
            expect_effect: False when validation already warned the adapter is untrained; a `no_effect` probe
                then only shows in the answer and the state report instead of failing the load.

        Raises:
            AgentError: `invalid_request` 400; `s3_object_missing` 404; `s3_error` 502;
                `sha256_mismatch`/`size_mismatch` 422; `engine_load_failed` 422; `no_effect` 422 (the adapter
                changed nothing; it was removed again); `lora_int_id_conflict` 409; `pin_failed` 409;
                `all_pinned` 409 (the CPU cache holds only pins); `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            try:
                staged = await asyncio.to_thread(self.cache.stage, lora_name, lora_int_id, list(files))
            except CacheError as exc:
                logger.warning(
                    "agent.stage_failed",
                    extra={"lora_name": lora_name, "lora_int_id": lora_int_id, "code": exc.code},
                )
                self.errored[lora_name] = (lora_int_id, exc.code)
                raise AgentError(exc.status, exc.code, exc.detail) from exc
            started = time.perf_counter()
            try:
                async with self._room:
                    evicted = await self._make_room(lora_int_id)
                    result = await self._add(lora_name, lora_int_id, str(staged.path), pin)
            except EngineError as exc:
                if exc.code != "engine_unavailable":
                    self.errored[lora_name] = (lora_int_id, exc.code)
                raise AgentError(exc.status, exc.code, exc.detail) from exc
            load_ms = (time.perf_counter() - started) * 1000.0
            effect = await self._effect(lora_name, files)
            if effect == "no_effect" and expect_effect:
                with contextlib.suppress(EngineError):
                    await self.engine.remove_lora(lora_name)
                self.errored[lora_name] = (lora_int_id, "no_effect")
                self.effects.pop(lora_name, None)
                logger.warning("agent.no_effect", extra={"lora_name": lora_name, "lora_int_id": lora_int_id})
                raise AgentError(422, "no_effect", f"'{lora_name}' changes nothing: greedy output and logprobs on a "
                                 "fixed prompt equal the base model's, so it would serve as the base model")
            self.errored.pop(lora_name, None)
            self.effects[lora_name] = (lora_int_id, effect)
            self._loaded_at[lora_int_id] = time.monotonic()
            tier = await self._tier_now(lora_int_id, note_steps=True)
        await self._enforce_budget({(lora_name, lora_int_id)})
        logger.info(
            "agent.loaded",
            extra={
                "lora_name": lora_name,
                "lora_int_id": lora_int_id,
                "pinned": result["pinned"],
                "download_ms": round(staged.download_ms, 1),
                "load_ms": round(load_ms, 1),
            },
        )
        return LoadResult(lora_name, lora_int_id, bool(result["pinned"]), staged.download_ms, load_ms, tier=tier,
                          effect=effect, evicted=evicted)

    async def _tier_now(self, lora_int_id: int, *, note_steps: bool = False) -> str:
        """The adapter's tier in the engine's own lists now (`hot`/`warm`; `warm` when they cannot be read);
        ``note_steps``: also record its scheduler steps as the eviction grace's baseline."""
        try:
            report = await self.engine.loras_report()
        except EngineError:
            return "warm"
        if note_steps:
            steps = (report.get("residency") or {}).get("steps") or {}
            if str(lora_int_id) in steps or lora_int_id in steps:
                self._steps_at_load[lora_int_id] = float(steps.get(str(lora_int_id), steps.get(lora_int_id, 0)))
        for lora in report.get("loras", []):
            if int(lora["lora_int_id"]) == lora_int_id and lora.get("tier") in ("gpu", "cpu"):
                return ENGINE_TIER_WORD[lora["tier"]]
        return "warm"

    def _decayed_steps(self, steps: dict[int, float], now: float) -> dict[int, float]:
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
                value = decayed_hits(seen[0], seen[1], now, self.eviction.half_life_s) + (total - seen[2])
            self._hits[i] = (value, now, total)
            out[i] = value
        if len(self._hits) > HITS_KEPT:
            for i in sorted(self._hits, key=lambda k: self._hits[k][1])[: len(self._hits) - HITS_KEPT]:
                del self._hits[i]
        return out

    async def _make_room(self, lora_int_id: int) -> tuple[str, ...]:
        """Drop from the engine's CPU cache the adapters ``choose_victims`` picks when it is full and ``lora_int_id``
        is not in it (``evict_lora``: their names stay served, reloaded from disk on their next request, as after
        vLLM's own LRU eviction). Without the worker's lists (no extension), vLLM's LRU decides, as before.

        Residents come from the engine's own figures (``inference.node.worker_ext``): recency = seconds since its
        last batch, frequency = scheduler steps that used it, reload cost = ``disk_reload_ms``.
        Adapters added here less than ``eviction_grace_s`` ago and not used since are left out while another
        unpinned one can go. Adapters the control plane's plan puts on other nodes only and idle here go before
        the policy's ranking (``_planned_elsewhere``).

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
        hits = self._decayed_steps(steps, clock)
        elsewhere = self._planned_elsewhere(idle, clock)
        # Undesired (first to go): an id no name serves (garbage), or one the plan moved to other nodes.
        residents = [Resident(version_id=i, tenant_id=0, size_bytes=sizes.get(i, 0), pinned=i in pinned,
                              last_used_s=-idle.get(i, 1e12), hits=hits.get(i, 0.0), hits_at_s=clock,
                              reload_ms=disk_reload_ms(sizes.get(i, 0)),
                              desired=i in names and i not in elsewhere)
                     for i in cpu]
        # An adapter whose own load or effect probe is in progress here is not a victim: removing its name while its
        # probe request runs makes vLLM re-add the weights for that batch, a copy no name serves (vllm#54839).
        busy = {i for i in cpu if names.get(i) in self._locks and self._locks[names[i]].locked()}
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
                                             incoming_bytes=0, now_s=clock, config=self.eviction)
            if not victims:
                victims = choose_victims(residents, slots=capacity - len(busy), budget_bytes=None, incoming_bytes=0,
                                         now_s=clock, config=self.eviction)
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
            logger.info("agent.evicted", extra={"lora_names": removed, "policy": self.eviction.policy.value,
                                                "for_lora_int_id": lora_int_id})
        return tuple(removed)

    async def _effect(self, lora_name: str, files: Sequence[FileSpec]) -> str:
        """The effect verdict for the weights in ``files``: the cached one when this agent already probed the same
        weights (a reload after an eviction), else ``probe_effect``'s (`unchecked` with the probe off)."""
        if not self.settings.effect_probe:
            return "unchecked"
        weights = tuple(sorted(f.sha256 for f in files))
        verdict = self._verdicts.get(weights)
        if verdict is None:
            verdict = await self.probe_effect(lora_name)
            if verdict != "unknown":
                self._verdicts[weights] = verdict
        return verdict

    async def probe_effect(self, lora_name: str) -> str:
        """Does the adapter change the output? ``PROBE_TOKENS`` greedy tokens on ``PROBE_PROMPT``, with and without it.

        Returns:
            `changed` (other tokens, or some chosen token's logprob differs by more than ``PROBE_TOLERANCE``),
            `no_effect` (identical: the adapter adds nothing, e.g. every lora_B is zero or its weights cancel, the
            `vllm#34186` class of silent no-ops), or `unknown` (the engine did not answer the probe). The base
            model's answer is asked once per agent process.
        """
        try:
            if self._base_probe is None:
                self._base_probe = await self.engine.complete_greedy(self.settings.base_model, PROBE_PROMPT,
                                                                     max_tokens=PROBE_TOKENS)
            ids, logprobs = await self.engine.complete_greedy(lora_name, PROBE_PROMPT, max_tokens=PROBE_TOKENS)
        except EngineError as exc:
            logger.warning("agent.probe_failed", extra={"lora_name": lora_name, "error": exc.detail})
            return "unknown"
        base_ids, base_logprobs = self._base_probe
        if ids != base_ids or len(logprobs) != len(base_logprobs):
            return "changed"
        delta = max((abs(a - b) for a, b in zip(logprobs, base_logprobs, strict=True)), default=0.0)
        return "changed" if delta > PROBE_TOLERANCE else "no_effect"

    async def _enforce_budget(self, keep: set[tuple[str, int]]) -> None:
        """Trim the disk cache to its byte budget (LRU), keeping what the engine holds in its CPU cache.

        A version served by name but out of the engine's cache (evicted to make room: the engine would reload it
        from these files) may go: its name is removed from the engine first, so its next request is a 404 the
        gateway re-routes, never a load from a deleted path."""
        if self.cache.max_bytes is None:
            return
        try:
            served = await self.engine.list_loras()
        except EngineError as exc:
            logger.warning("agent.budget_skipped", extra={"error": exc.detail})
            return  # without the engine's list, deleting could pull files from under a served adapter
        keep |= {(lora["lora_name"], int(lora["lora_int_id"])) for lora in served if lora.get("in_engine", True)}
        by_name = {lora["lora_name"]: int(lora["lora_int_id"]) for lora in served}
        victims = await asyncio.to_thread(self.cache.over_budget, keep)
        for entry in victims:
            if by_name.get(entry.lora_name) != entry.lora_int_id:
                continue
            async with self._locks[entry.lora_name]:
                try:
                    await self.engine.remove_lora(entry.lora_name)
                except EngineError as exc:
                    if exc.code != "lora_not_found":
                        logger.warning("agent.budget_skipped", extra={"error": exc.detail})
                        return
                self.effects.pop(entry.lora_name, None)
        await asyncio.to_thread(self.cache.delete, victims)

    async def _add(self, lora_name: str, lora_int_id: int, lora_path: str, pin: bool) -> dict[str, Any]:
        try:
            return await self.engine.add_lora(lora_name, lora_int_id, lora_path, pin=pin)
        except EngineError as exc:
            if exc.code != "lora_name_conflict":
                raise
        # Same name, other id: swap versions (remove the old id so its CPU slot and pin are freed).
        logger.info("agent.version_swap", extra={"lora_name": lora_name, "lora_int_id": lora_int_id})
        await self.engine.remove_lora(lora_name)
        return await self.engine.add_lora(lora_name, lora_int_id, lora_path, pin=pin)

    async def unload(self, lora_name: str, *, purge: bool = False) -> dict[str, Any]:
        """`remove_lora` from the engine; staged files stay on disk unless `purge` (the adapter was deleted).

        Idempotent: an adapter that is not served but is staged answers 200 too.

        Returns:
            `{"lora_name", "tier"}`: tier `staged`, or `cold` after a purge.

        Raises:
            AgentError: `lora_not_found` 404 (neither served nor staged); `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            try:
                await self.engine.remove_lora(lora_name)
            except EngineError as exc:
                if exc.code != "lora_not_found":
                    raise AgentError(exc.status, exc.code, exc.detail) from exc
                staged = await asyncio.to_thread(self.cache.staged)
                if not any(e.lora_name == lora_name for e in staged):
                    raise AgentError(
                        404, "lora_not_found", f"'{lora_name}' is neither loaded nor staged"
                    ) from exc
            self.errored.pop(lora_name, None)
            self.effects.pop(lora_name, None)
            if purge:
                await asyncio.to_thread(self.cache.remove, lora_name)
        logger.info("agent.unloaded", extra={"lora_name": lora_name, "purge": purge})
        return {"lora_name": lora_name, "tier": "cold" if purge else "staged"}

    async def pin(self, lora_name: str) -> dict[str, Any]:
        """`pin_lora` a served adapter.

        Raises:
            AgentError: `lora_not_found` 404; `pin_failed` 409; `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            try:
                result = await self.engine.pin_lora(lora_name)
            except EngineError as exc:
                raise AgentError(exc.status, exc.code, exc.detail) from exc
        logger.info("agent.pinned", extra={"lora_name": lora_name})
        lora_int_id = result.get("lora_int_id")
        return {
            "lora_name": lora_name,
            "lora_int_id": lora_int_id,
            "tier": await self._tier_now(int(lora_int_id)) if lora_int_id else "warm",
            "pinned": True,
        }

    async def set_eviction_policy(self, policy: str) -> dict[str, str]:
        """Rank this node's victims by ``policy`` from now on, here and in the engine's workers (until the agent
        restarts: then ``QUIVER_EVICTION_POLICY`` again). The counts the policies rank by are kept.

        Raises:
            AgentError: 400 `invalid_policy`; the engine's error (503 `worker_extension_missing`, unreachable).
        """
        try:
            config = EvictionConfig(policy=EvictionPolicy(policy), half_life_s=self.eviction.half_life_s)
        except ValueError as exc:
            raise AgentError(400, "invalid_policy",
                             f"policy must be one of {', '.join(p.value for p in EvictionPolicy)}") from exc
        async with self._policy_lock:
            try:
                await self.engine.set_eviction_policy(config.policy.value)
            except EngineError as exc:
                raise AgentError(exc.status, exc.code, exc.detail) from exc
            self.eviction = config
        logger.info("agent.eviction_policy", extra={"policy": config.policy.value})
        return {"policy": config.policy.value}

    async def _sync_engine_policy(self, engine_residency: dict[str, Any] | None) -> None:
        """Send the agent's policy to an engine that ranks by another (its own environment's, or its default after
        a restart), so that a reload inside the engine picks the victim the agent would."""
        engine_policy = ((engine_residency or {}).get("eviction") or {}).get("policy")
        if engine_policy is None or engine_policy == self.eviction.policy.value:
            return
        async with self._policy_lock:
            # Compared again under the lock: a switch that was in flight when the engine was read has finished, and
            # the engine then reported the policy it set (the agent's own now).
            if engine_policy == self.eviction.policy.value:
                return
            try:
                await self.engine.set_eviction_policy(self.eviction.policy.value)
            except EngineError as exc:
                logger.warning("agent.eviction_policy_not_set", extra={"error": exc.detail})
                return
        engine_residency["eviction"]["policy"] = self.eviction.policy.value  # type: ignore[index]
        logger.info("agent.eviction_policy_sent", extra={"policy": self.eviction.policy.value,
                                                          "engine_had": engine_policy})

    async def _metrics(self) -> EngineMetrics | None:
        try:
            return parse_engine_metrics(await self.engine.metrics_text())
        except (EngineError, ValueError) as exc:
            logger.warning("agent.metrics_unavailable", extra={"error": str(exc)})
            return None

    async def state(self) -> dict[str, Any]:
        """The `GET /v1/state` report (also the heartbeat body).

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
        healthy = await self.engine.health()
        served: list[dict[str, Any]] = []
        engine_residency: dict[str, Any] | None = None
        metrics: EngineMetrics | None = None
        if healthy:
            try:
                report = await self.engine.loras_report()
                served = list(report.get("loras", []))
                engine_residency = report.get("residency")
                await self._sync_engine_policy(engine_residency)
            except EngineError as exc:
                logger.warning("agent.list_loras_failed", extra={"error": exc.detail})
                healthy = False
            metrics = await self._metrics()
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
                "tier": _tier(lora, hot),
                "pinned": bool(lora["pinned"]),
                "served": True,
                "bytes": int(lora.get("bytes") or 0),
                "loads": loads.get(lora_id, 0),
            }
            effect = self.effects.get(lora["lora_name"])
            if effect is not None and effect[0] == lora_id:
                report_entry["effect"] = effect[1]
            adapters.append(report_entry)
        staged = await asyncio.to_thread(self.cache.staged)
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
        for name, (lora_int_id, code) in self.errored.items():
            if name not in served_names:
                adapters = [a for a in adapters if a["lora_name"] != name]
                adapters.append({"lora_name": name, "lora_int_id": lora_int_id, "tier": "errored",
                                 "pinned": False, "served": False, "bytes": 0, "error_code": code})
        adapters.sort(key=lambda a: (a["lora_name"], a["lora_int_id"]))
        s = self.settings
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


def _dir_bytes(path: Any) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def residency_summary(adapters: list[dict[str, Any]], engine: dict[str, Any] | None, disk_bytes: int) -> dict[str, Any]:
    """Counts and bytes per tier for the state report (see `NodeAgent.state`).

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
