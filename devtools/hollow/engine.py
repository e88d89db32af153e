"""One emulated vLLM engine: its served names, its two LoRA LRUs, a scheduler loop and the counters ``/metrics`` shows.

The LRUs are ``inference.policy.engine_model.LoRAEngineModel`` (vLLM's ``LRUCacheWorkerLoRAManager`` rules). The
scheduler follows vLLM V1's in the parts the control plane can see: FCFS admission while ``max_num_seqs`` and KV
blocks allow, at most ``max_loras`` distinct adapters per step (a request of another adapter is skipped and waits:
``num_requests_waiting_by_reason{reason="deferred"}``), an adapter not in a GPU slot is activated before the step
(a disk → CPU load when vLLM's LRU dropped it, then a CPU → GPU copy), and a sequence that cannot get a KV block
preempts the newest running one (recomputed later: ``num_preemptions_total``). Time comes from
``devtools.hollow.costs.EngineCosts``; several steps may be taken in one wake-up (``tick_ms``) so that dozens of
engines fit in one process.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from devtools.hollow.costs import EngineCosts
from inference.policy.engine_model import LoRAEngineModel
from inference.policy.eviction import AllPinnedError, EvictionConfig, EvictionPolicy, decayed_hits
from inference.policy.node_eviction import NodeResident, is_fresh, node_victims
from inference.policy.tiers import Tier

FRESH_LOAD_S = 2.0
HALF_LIFE_S = EvictionConfig().half_life_s  # the worker extension's decay of request counts (seconds)


@dataclass
class ServedLora:
    """A name the engine serves (``lora_requests`` in vLLM's ``OpenAIServingModels``)."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    size: int


@dataclass(eq=False)
class Sequence:
    """One choice of one request in the engine.

    Attributes:
        prompt_tokens: the prompt's length.
        max_tokens: tokens to generate.
        lora_int_id: the adapter, or None for the base model.
        generated: tokens generated so far.
        blocks: KV blocks held.
        prefilled: whether its prompt has been through a step (again after a preemption).
        event: set whenever tokens were added or the sequence finished.
        done: finished (all tokens, or aborted).
    """

    prompt_tokens: int
    max_tokens: int
    lora_int_id: int | None
    generated: int = 0
    blocks: int = 0
    prefilled: bool = False
    done: bool = False
    arrived: float = field(default_factory=time.monotonic)
    event: asyncio.Event = field(default_factory=asyncio.Event)


class LoadError(Exception):
    """The adapter cannot be loaded (missing files, rank above ``max_lora_rank``): vLLM's plain exceptions."""


class HollowEngine:
    """The engine state behind one emulated server.

    Args:
        model: the served base model name.
        costs: the cost model.
        max_loras: GPU slots.
        max_cpu_loras: CPU cache entries.
        max_lora_rank: largest accepted ``r``.
        tick_ms: shortest wall time between scheduler wake-ups (several steps per wake-up when steps are shorter).
        charge_all_linear: charge every adapter as if it targeted all seven projections (its 8B all-linear size).
    """

    def __init__(self, model: str, costs: EngineCosts, *, max_loras: int, max_cpu_loras: int,
                 max_lora_rank: int = 16, tick_ms: float = 20.0, charge_all_linear: bool = False) -> None:
        self.model = model
        self.charge_all_linear = charge_all_linear
        self.costs = costs
        self.max_lora_rank = max_lora_rank
        self.tick_ms = tick_ms
        self.loras = LoRAEngineModel(max_loras, max_cpu_loras)
        self.served: dict[str, ServedLora] = {}
        self.sizes: dict[int, int] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_blocks = costs.kv_blocks
        self.preemptions = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.request_success = 0
        self.loads: Counter[int] = Counter()  # disk → CPU loads per id (vLLM's ``_load_adapter`` calls)
        self.load_sources: Counter[str] = Counter()  # ``add_lora`` (the agent's warms) or ``request`` (reloads)
        self.fresh_loads: dict[int, float] = {}  # id → when ``add_lora`` loaded it, until its next request
        self.requests: Counter[int] = Counter()
        self.steps: Counter[int] = Counter()
        self.last_used: dict[int, float] = {}
        self.arrival_tiers: Counter[str] = Counter()  # tier of each adapter request's adapter when it arrived
        self.probes = 0  # the node agent's effect probes (requests of its own after a load; not in arrival_tiers)
        # (wall time s, lora_int_id, what): "arrive:<tier>" per adapter request, "load:<source>" per disk → CPU
        # load, "drop:lru" / "drop:remove" when it leaves the CPU cache: the scale run compares them per request
        # with the simulator's decisions (devtools.hollow.compare).
        self.events: list[tuple[float, int, str]] = []
        self.moves = {"disk_to_cpu": 0, "cpu_to_gpu": 0, "disk_to_cpu_s": 0.0, "cpu_to_gpu_s": 0.0}
        # The worker extension's rule for a load into a full CPU cache (``worker_ext.policy_victim``, production's
        # ``QUIVER_EVICTION_POLICY`` default ``lfu``; the agent may set another); vLLM's LRU only when it declines.
        self.eviction_policy = "lfu"
        self.grace_s = 5.0  # QUIVER_EVICTION_GRACE_MS's default
        self.hits: dict[int, tuple[float, float]] = {}  # id -> (decayed requests, at): worker_ext.HITS
        self.loaded_at: dict[int, tuple[float, int]] = {}  # id -> (last load, requests then): worker_ext.LOADED
        self.hints: tuple[float, frozenset[int], frozenset[int]] = (-1.0, frozenset(), frozenset())
        self.busy_ms = 0.0
        self.stall_ms = 0.0  # moves asked outside steps (``add_lora``), charged to the next step
        self.deferred = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.fingerprint = "vllm-0.32.0-hollow-" + hashlib.sha256(model.encode()).hexdigest()[:8]
        self._ids = itertools.count(1)

    # -- LoRA control (engine_ext's add/remove/evict/pin over vLLM's engine calls) --------------------------------

    def add_lora(self, lora: ServedLora) -> float:
        """vLLM's ``add_lora``: register in the CPU cache and activate into a GPU slot (what the real engine does,
        docs/placement.md "True residency"). Returns the ms the load costs (0 when already registered)."""
        self.sizes[lora.lora_int_id] = lora.size
        ms = 0.0
        if self.loras.tier(lora.lora_int_id) is Tier.COLD:
            self._make_room(self._adapters_running())
            ms += self._count_load(lora.lora_int_id, "add_lora")
            self.fresh_loads[lora.lora_int_id] = time.monotonic()
        if self.loras.tier(lora.lora_int_id) is not Tier.GPU:
            ms += self._count_swap()
        self._forget(self.loras.activate(lora.lora_int_id)[0])
        self.last_used[lora.lora_int_id] = time.monotonic()
        self.stall_ms += ms
        return ms

    def _count_load(self, lora_int_id: int, source: str) -> float:
        ms = self.costs.disk_to_cpu_ms(self.sizes.get(lora_int_id, 0))
        self.loads[lora_int_id] += 1
        self.load_sources[source] += 1
        now = time.monotonic()
        self.last_used[lora_int_id] = now  # a fresh load counts as a use for recency (worker_ext.counted_load)
        self.loaded_at[lora_int_id] = (now, self.requests[lora_int_id])
        self.events.append((time.time(), lora_int_id, f"load:{source}"))
        self.moves["disk_to_cpu"] += 1
        self.moves["disk_to_cpu_s"] += ms / 1000
        return ms

    def _count_swap(self) -> float:
        ms = self.costs.cpu_to_gpu_ms()
        self.moves["cpu_to_gpu"] += 1
        self.moves["cpu_to_gpu_s"] += ms / 1000
        return ms

    def _make_room(self, in_use: set[int]) -> None:
        """Before a load into a full CPU cache, drop the victim of production's worker extension
        (``inference.node.worker_ext.policy_victim``: ``node_victims`` over decayed requests, recency, the grace of a
        fresh load and the control plane's hints, never the running batch ``in_use``); when it declines (every
        resident pinned or in use), vLLM's LRU decides in ``activate``."""
        if len(self.loras.cpu) < self.loras.max_cpu_loras:
            return
        now = time.monotonic()
        until, over_quota, elsewhere = self.hints
        if now > until:
            over_quota = elsewhere = frozenset()
        config = EvictionConfig(policy=EvictionPolicy(self.eviction_policy), half_life_s=HALF_LIFE_S)
        residents = []
        for i in self.loras.cpu:
            hits, hits_at = self.hits.get(i, (0.0, now))
            loaded, then = self.loaded_at.get(i, (-1e18, 0))
            idle = now - self.last_used.get(i, -1e12)
            residents.append(NodeResident(
                version_id=i, size_bytes=self.sizes.get(i, 0), pinned=i in self.loras.pinned, idle_s=idle,
                requests=decayed_hits(hits, hits_at, now, config.half_life_s), busy=i in in_use,
                fresh=is_fresh(loaded_ago_s=now - loaded, requests_since_load=self.requests[i] - then, idle_s=idle,
                               grace_s=self.grace_s),
                planned_elsewhere=i in elsewhere, tenant_over_quota=i in over_quota))
        try:
            victims = node_victims(residents, capacity=len(residents), now_s=now, config=config)
        except AllPinnedError:
            return
        if victims:
            self.loras.remove_lora(victims[0])
            self.last_used.pop(victims[0], None)
            self._forget([victims[0]], "drop:policy")

    def _forget(self, evicted: list[int], what: str = "drop:lru") -> None:
        for lora_int_id in evicted:
            self.fresh_loads.pop(lora_int_id, None)
            self.events.append((time.time(), lora_int_id, what))

    def remove_lora(self, lora_int_id: int) -> bool:
        """vLLM's ``remove_lora``: out of both tiers (and unpinned)."""
        self.last_used.pop(lora_int_id, None)
        self.fresh_loads.pop(lora_int_id, None)
        removed = self.loras.remove_lora(lora_int_id)
        if removed:
            self.events.append((time.time(), lora_int_id, "drop:remove"))
        return removed

    def pin_lora(self, lora_int_id: int) -> None:
        """vLLM's ``pin_lora`` (CPU copy only, as Quiver's worker extension makes it).

        Raises:
            inference.policy.eviction.AllPinnedError: the CPU cache is all pins.
        """
        self.loras.pin_lora(lora_int_id)

    # -- requests --------------------------------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, max_tokens: int, lora_int_id: int | None, *,
               event: asyncio.Event | None = None, first: bool = True, probe: bool = False) -> Sequence:
        """Queue one sequence and wake the scheduler; ``event`` is shared by a request's sequences, ``first`` marks
        the request's first sequence (counted once per request), ``probe`` the node agent's effect probe (counted in
        ``probes`` only: not a client's request, so neither its tier nor the fresh load it follows)."""
        seq = Sequence(prompt_tokens=max(1, prompt_tokens), max_tokens=max(1, max_tokens), lora_int_id=lora_int_id,
                       event=event or asyncio.Event())
        if lora_int_id is not None and first and probe:
            self.probes += 1
            self.events.append((time.time(), lora_int_id, "probe"))
        elif lora_int_id is not None and first:
            # The first request within FRESH_LOAD_S of a load by ``add_lora`` is the one that load was for (the
            # gateway warms a version through the control plane, then sends it): it counts as a miss, "warmed".
            loaded = self.fresh_loads.pop(lora_int_id, None)
            fresh = loaded is not None and time.monotonic() - loaded < FRESH_LOAD_S
            tier = "warmed" if fresh else self.loras.tier(lora_int_id).value
            self.arrival_tiers[tier] += 1
            hits, at = self.hits.get(lora_int_id, (0.0, time.monotonic()))
            now = time.monotonic()
            self.hits[lora_int_id] = (decayed_hits(hits, at, now, HALF_LIFE_S) + 1.0, now)
            self.events.append((time.time(), lora_int_id, f"arrive:{tier}"))
            self.requests[lora_int_id] += 1
        self.waiting.append(seq)
        self._ensure_running()
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence whose client went away (its blocks freed)."""
        if seq.done:
            return
        seq.done = True
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def next_id(self) -> int:
        """A fresh request number (for response ids)."""
        return next(self._ids)

    # -- the scheduler ---------------------------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = time.monotonic()
            spent = 0.0
            while spent < self.tick_ms and (self.running or self.waiting):
                ms = self.step()
                if ms <= 0:
                    break
                spent += ms
            # Sleep the modelled time, less what the Python work of these steps already took.
            await asyncio.sleep(max(0.0, spent / 1000 - (time.monotonic() - started)) or 0.001)

    def _adapters_running(self) -> set[int]:
        return {s.lora_int_id for s in self.running if s.lora_int_id is not None}

    def _admit(self) -> tuple[float, int]:
        """Admit waiting sequences (FCFS, skipping those of adapters past ``max_loras``); returns the ms of the moves
        they need and the prompt tokens to prefill."""
        adapters = self._adapters_running()
        moves_ms = 0.0
        prefill = 0
        kept: deque[Sequence] = deque()
        self.deferred = 0
        while self.waiting:
            seq = self.waiting.popleft()
            if len(self.running) >= self.costs.max_num_seqs:
                kept.append(seq)
                continue
            lora = seq.lora_int_id
            if lora is not None and lora not in adapters and len(adapters) >= self.loras.max_loras:
                self.deferred += 1
                kept.append(seq)
                continue
            need = self.costs.blocks(seq.prompt_tokens + seq.generated + 1)
            if need > self.free_blocks:
                kept.append(seq)
                kept.extend(self.waiting)
                self.waiting.clear()
                break
            self.free_blocks -= need
            seq.blocks = need
            if lora is not None:
                if lora not in adapters:
                    tier = self.loras.tier(lora)
                    if tier is Tier.COLD:
                        self._make_room(adapters)
                        moves_ms += self._count_load(lora, "request")
                    if tier is not Tier.GPU:
                        moves_ms += self._count_swap()
                    adapters.add(lora)
                self._forget(self.loras.activate(lora)[0])
            if not seq.prefilled:
                prefill += seq.prompt_tokens + seq.generated
                seq.prefilled = True
            self.running.append(seq)
        self.waiting = kept
        return moves_ms, prefill

    def _grow(self, seq: Sequence) -> bool:
        """Give ``seq`` the block its next token needs, preempting the newest other sequences; False if it was
        preempted itself."""
        need = self.costs.blocks(seq.prompt_tokens + seq.generated + 1) - seq.blocks
        while need > self.free_blocks:
            victim = self.running[-1]
            self.running.pop()
            self.free_blocks += victim.blocks
            victim.blocks = 0
            victim.prefilled = False
            self.waiting.appendleft(victim)
            self.preemptions += 1
            if victim is seq:
                return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def step(self) -> float:
        """One scheduler step: admit, move adapters, generate one token per running sequence. Returns its ms."""
        moves_ms, prefill = self._admit()
        if not self.running:
            return 0.0
        adapters = self._adapters_running()
        now = time.monotonic()
        for lora in adapters:
            self.steps[lora] += 1
            self.last_used[lora] = now
        ms = self.costs.step_ms(len(self.running), len(adapters), prefill) + moves_ms + self.stall_ms
        self.stall_ms = 0.0
        self.busy_ms += ms
        self.prompt_tokens += prefill
        for seq in list(self.running):
            if seq not in self.running or not self._grow(seq):
                continue
            seq.generated += 1
            self.generation_tokens += 1
            if seq.generated >= seq.max_tokens:
                seq.done = True
                self.running.remove(seq)
                self.free_blocks += seq.blocks
                seq.blocks = 0
                self.request_success += 1
            seq.event.set()
        return ms

    # -- what /metrics and /quiver/v1/loras read ---------------------------------------------------------------------

    def kv_usage(self) -> float:
        """Share of KV blocks in use."""
        return 1.0 - self.free_blocks / self.costs.kv_blocks

    def lora_names(self, seqs: list[Sequence] | deque[Sequence]) -> list[str]:
        """Served names of the adapters of ``seqs`` (vLLM's ``running_lora_adapters`` / ``waiting_…``)."""
        by_id = {s.lora_int_id: s.lora_name for s in self.served.values()}
        return sorted({by_id[s.lora_int_id] for s in seqs if s.lora_int_id in by_id})

    def residency(self) -> dict[str, object]:
        """The worker extension's residency report (``inference.node.worker_ext.lora_residency``)."""
        now = time.monotonic()
        cpu = self.loras.cpu
        return {
            "enabled": True,
            "gpu": list(self.loras.gpu),
            "cpu": sorted(cpu),
            "pinned": sorted(self.loras.pinned),
            "max_loras": self.loras.max_loras,
            "max_cpu_loras": self.loras.max_cpu_loras,
            "slot_bytes": self.costs.slot_bytes(),
            "bytes": {i: self.sizes.get(i, 0) for i in cpu},
            "lru": list(cpu),
            "loads": dict(self.loads),
            "loads_total": sum(self.loads.values()),
            "steps": {i: self.steps.get(i, 0) for i in cpu},
            "requests": {i: self.requests.get(i, 0) for i in cpu},
            "idle_s": {i: round(now - self.last_used[i], 3) for i in cpu if i in self.last_used},
            "moves": dict(self.moves),
            "eviction": {"policy": self.eviction_policy, "evictions": {}},
        }
