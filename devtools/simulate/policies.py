"""Policies under test. ``quiver`` calls the production decisions; the baselines leave eviction to vLLM's LRU.

- ``quiver``: ``inference.policy.placement.place`` every ``replan_s`` over decayed request rates (what the
  reconciler does), ``inference.policy.routing.route`` per request, and before each engine load into a full CPU
  cache the node's own rule, ``inference.policy.node_eviction.node_victims`` (the agent's and the engine worker's:
  decayed *request* counts, the plan hint, the busy set = adapters with a request in flight, the grace of a fresh
  load); the disk cache is LRU under its byte budget, never dropping what the engine holds (the agent's
  ``enforce_disk_budget``), and GPU slots are the engine's batch LRU (``LoRAEngineModel``), as on a node.
- ``random``, ``round_robin``: the node at random / in turn.
- ``least_loaded``: today's Quiver: a version's first request warms it on the node with the fewest resident
  versions (then the shortest queue) and every later request goes there (``node_select_for_warm``, ``node_for``).
- ``lru_where_loaded``: GIE's stock scorers summed: LoRA affinity (active 1.0, free slot 0.8, else 0), queue
  (``(max − q)/(max − min)``), KV (1 − usage); ties at random (``MaxScorePicker``); vLLM's LRU evicts.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from devtools.simulate.costs import CostModel
from devtools.simulate.fleet import SimNode
from inference.policy.eviction import EvictionConfig, EvictionPolicy, decayed_hits
from inference.policy.hrw import hrw_weight
from inference.policy.node_eviction import NodeResident, is_fresh, node_victims
from inference.policy.placement import (
    Demand,
    PlacementConfig,
    PlacementNode,
    WarmCandidate,
    place,
    slotted,
    warm_target,
)
from inference.policy.routing import Candidate, RouteConfig, plan_candidates, route
from inference.policy.tiers import Tier

BASE = "base"
# The gateway asks for a move's warm at most this often per (version, node) (inference.gateway.app.REWARM_S).
REWARM_S = 2.0
# From a move's ask to the gateway routing to the new home: Celery task, the agent's load, a heartbeat, the fleet
# view's refresh. bench_fleet's recordings: requests 1.7-1.8 s after the ask still went to the old holder, those
# 2.4-2.9 s after it to the home (docs/placement.md).
WARM_S = 2.0


@dataclass
class Reconciler:
    """How the simulated reconciler reads request rates, as ``inference.fleet.reconcile.fleet_reconcile`` does:
    every version's requests in the last ``window_s`` seconds over the window, ``prior`` (adapter index -> requests
    before the run, still inside the window) included; it plans at ``passes`` (seconds; a recorded run's pass
    times) or, when None, every ``replan_s``."""

    window_s: float = 600.0
    prior: Mapping[int, int] = field(default_factory=dict)
    passes: Sequence[float] | None = None
    next_pass: int = 0


class Policy:
    """A routing + eviction policy. Subclasses override ``choose`` and optionally the hooks."""

    name = ""

    def __init__(self, nodes: Sequence[SimNode], *, seed: int) -> None:
        self.nodes = list(nodes)
        self.rng = random.Random(seed)

    def tick(self, t: float) -> None:
        """Called before each request at time ``t``."""

    def choose(self, adapter: int, t: float) -> SimNode:
        """The node that serves a request for ``adapter`` at ``t``."""
        raise NotImplementedError

    def make_room(self, node: SimNode, adapter: int, t: float) -> None:
        """Called before ``adapter`` is loaded into ``node``'s full CPU cache; default: vLLM's LRU decides."""

    def disk_victim(self, node: SimNode, incoming: int, t: float) -> list[int]:
        """Disk entries to drop for ``incoming`` bytes: LRU, never one the engine's CPU cache holds (the agent's
        ``enforce_disk_budget`` over ``inference.node.cache.AdapterCache.over_budget``)."""
        out, used = [], node.disk_used
        held = node.engine.cpu
        for key, size in node.disk.items():
            if used + incoming <= node.disk_bytes:
                break
            if key in held:
                continue
            out.append(key)
            used -= size
        return out

    def loaded(self, node: SimNode, adapter: int, t: float) -> None:
        """Called when ``adapter`` is read into ``node``'s engine (a request's load or a pre-warm)."""

    def served(self, node: SimNode, adapter: int, t: float) -> None:
        """Called after each request is placed on ``node``."""

    # Loads, S3 fetches and bytes the policy caused outside requests (the reconciler's pre-warms, the gateway's
    # warms behind a move).
    extra_loads = 0
    extra_fetches = 0
    extra_bytes = 0
    # The last ``choose`` sent its request to a node that the control plane is warming the adapter on for it
    # (the request waits for that warm; the simulator books the load with the request).
    warmed = False


class RandomPolicy(Policy):
    """Uniformly random node."""

    name = "random"

    def choose(self, adapter: int, t: float) -> SimNode:
        """A random node."""
        return self.nodes[self.rng.randrange(len(self.nodes))]


class RoundRobinPolicy(Policy):
    """Nodes in turn."""

    name = "round_robin"
    _i = 0

    def choose(self, adapter: int, t: float) -> SimNode:
        """The next node."""
        self._i += 1
        return self.nodes[self._i % len(self.nodes)]


class TodayPolicy(Policy):
    """Today's Quiver: sticky single placement on the node with the fewest resident versions."""

    name = "least_loaded"

    def __init__(self, nodes: Sequence[SimNode], *, seed: int) -> None:
        super().__init__(nodes, seed=seed)
        self.home: dict[int, SimNode] = {}
        self.count = {n.name: 0 for n in nodes}

    def choose(self, adapter: int, t: float) -> SimNode:
        """The version's node, placing it on first use."""
        node = self.home.get(adapter)
        if node is None:
            node = min(self.nodes, key=lambda n: (self.count[n.name], len(n.inflight), n.name))
            self.home[adapter] = node
            self.count[node.name] += 1
        return node


class LruWhereLoadedPolicy(Policy):
    """GIE's stock scorers (LoRA affinity + queue + KV), random ties, the engine's LRU."""

    name = "lru_where_loaded"

    def choose(self, adapter: int, t: float) -> SimNode:
        """Highest summed score."""
        queues = [n.waiting for n in self.nodes]
        qmin, qmax = min(queues), max(queues)
        best: list[SimNode] = []
        top = -1.0
        for n, q in zip(self.nodes, queues, strict=True):
            gpu = n.engine.gpu
            affinity = 1.0 if adapter in gpu else (0.8 if len(gpu) < n.engine.max_loras else 0.0)
            queue = 1.0 if qmax == qmin else (qmax - q) / (qmax - qmin)
            score = affinity + queue + (1.0 - n.kv)
            if score > top + 1e-9:
                top, best = score, [n]
            elif score > top - 1e-9:
                best.append(n)
        return best[0] if len(best) == 1 else self.rng.choice(best)


@lru_cache(maxsize=1 << 18)
def _hrw(adapter: int, node: str) -> int:
    return hrw_weight(adapter, node)


class QuiverPolicy(Policy):
    """The production decisions of ``inference.policy``."""

    name = "quiver"

    def __init__(self, nodes: Sequence[SimNode], *, seed: int, sizes: Sequence[int], ranks: Sequence[int],
                 tenants: Sequence[int], costs: CostModel, eviction: EvictionPolicy = EvictionPolicy.LFU,
                 replan_s: float = 30.0, rate_memory: float = 0.8, prewarm: bool = True, half_life_s: float = 600.0,
                 placement: PlacementConfig | None = None, routing: RouteConfig | None = None,
                 grace_s: float = 5.0, ids: Sequence[int] | None = None, warm_s: float = WARM_S,
                 reconciler: Reconciler | None = None, unloads: Sequence[tuple[float, str, int]] = ()) -> None:
        super().__init__(nodes, seed=seed)
        # (s, node, adapter index), ascending: an operator's evictions (``placement_evict``: the engine drops the
        # version and the node no longer serves its name), as a scale run performs them during its replay.
        self._unloads = deque(sorted(unloads))
        # Adapter index -> the version id production hashes (HRW in routing, placement and warm_target).
        self.ids = list(ids) if ids is not None else list(range(len(sizes)))
        self.index = {v: a for a, v in enumerate(self.ids)}
        self.warm_s = warm_s
        self.reconciler = reconciler
        self._warms: list[tuple[float, int, str]] = []  # (due, adapter, node): the gateway's warms behind moves
        self._asked: dict[tuple[int, str], float] = {}  # (adapter, node) -> a move's warm asked again after this
        self._seen: dict[int, deque[float]] = {}  # adapter -> its request times (the reconciler's rate window)
        self.by_name = {n.name: n for n in nodes}
        self._weights: dict[int, tuple[int, ...]] = {}  # adapter -> HRW weight per node, in node order
        self.sizes, self.ranks, self.tenants, self.costs = sizes, ranks, tenants, costs
        self.eviction = EvictionConfig(policy=eviction, half_life_s=half_life_s)
        self.replan_s, self.rate_memory, self.prewarm = replan_s, rate_memory, prewarm
        self.placement, self.routing = placement or PlacementConfig(), routing or RouteConfig()
        self.rates: dict[int, float] = {}
        self.window: dict[int, int] = {}
        self.plan: dict[int, tuple[str, ...]] = {}
        # Per node, per adapter: [last request, decayed requests, their time, requests in all, last load, requests
        # at that load] (what the worker extension counts: ``LAST_USED``, ``HITS``, ``REQUESTS``, ``LOADED``).
        self.res: dict[str, dict[int, list[float]]] = {n.name: {} for n in nodes}
        self.grace_s = grace_s
        self.last_plan = 0.0
        self._warm_candidates = [WarmCandidate(n.name, costs.max_lora_rank) for n in nodes]
        self.pnodes = [PlacementNode(n.name, BASE, costs.max_lora_rank, n.engine.max_cpu_loras, gpu_slots=n.engine.max_loras)
                       for n in nodes]

    def tick(self, t: float) -> None:
        """Finish the gateway's warms due by ``t``; re-plan every ``replan_s`` seconds (or at the ``reconciler``'s
        pass times), as the reconciler would on Celery beat."""
        while self._warms and self._warms[0][0] <= t:
            due, adapter, name = heapq.heappop(self._warms)
            self._load(self.by_name[name], adapter, due)
        while self._unloads and self._unloads[0][0] <= t:
            _, name, adapter = self._unloads.popleft()
            self.unload(self.by_name[name], adapter)
        rec = self.reconciler
        if rec is not None and rec.passes is not None:
            if rec.next_pass >= len(rec.passes) or t < rec.passes[rec.next_pass]:
                return
            while rec.next_pass < len(rec.passes) and rec.passes[rec.next_pass] <= t:
                rec.next_pass += 1
        elif t - self.last_plan < self.replan_s:
            return
        demands = self._demands(t) if rec is not None else self._smoothed_demands(t)
        plan = place(demands, self.pnodes, config=self.placement)
        self.plan = {self.index[v]: nodes for v, nodes in plan.items()}
        self.last_plan = t
        if self.prewarm:
            fits = slotted(plan, demands, self.pnodes)
            self._prewarm(t, frozenset((self.index[v], n) for v, n in fits))

    def _smoothed_demands(self, t: float) -> list[Demand]:
        """Exponentially smoothed rates of the versions with traffic, resident where an engine holds them."""
        span = t - self.last_plan
        keep = self.rate_memory
        for adapter in set(self.rates) | set(self.window):
            self.rates[adapter] = keep * self.rates.get(adapter, 0.0) + (1 - keep) * self.window.get(adapter, 0) / span
        self.window.clear()
        held: dict[int, set[str]] = {}
        for n in self.nodes:
            for a in n.engine.cpu:
                held.setdefault(a, set()).add(n.name)
        return [Demand(self.ids[a], BASE, self.ranks[a], self.sizes[a], rate, resident_on=frozenset(held.get(a, ())),
                       planned_on=frozenset(self.plan.get(a, ())))
                for a, rate in self.rates.items() if rate > 1e-4]

    def _demands(self, t: float) -> list[Demand]:
        """What ``fleet_reconcile`` asks ``place`` for: every version, at its requests in the last ``window_s``
        (those before the run from ``prior``) over the window, resident where a node serves it (in an engine or by
        name from disk: ``held``)."""
        rec = self.reconciler
        assert rec is not None
        out = []
        for a in range(len(self.sizes)):
            seen = self._seen.get(a)
            while seen and seen[0] <= t - rec.window_s:
                seen.popleft()
            count = rec.prior.get(a, 0) + (len(seen) if seen else 0)
            held = frozenset(n.name for n in self.nodes if a in n.disk or a in n.engine.cpu)
            out.append(Demand(self.ids[a], BASE, self.ranks[a], self.sizes[a], count / rec.window_s,
                              resident_on=held, planned_on=frozenset(self.plan.get(a, ()))))
        return out

    def _prewarm(self, t: float, fits: frozenset[tuple[int, str]]) -> None:
        """The reconciler's warm tasks (``fleet_reconcile._prewarm``; the simulator has no operator intent): every
        replica of a replicated version within the nodes' CPU slots (``slotted``) that its engine lacks is loaded."""
        for adapter, names in self.plan.items():
            if len(names) < 2:
                continue
            for name in names:
                if (adapter, name) in fits:
                    self._load(self.by_name[name], adapter, t)

    def _load(self, node: SimNode, adapter: int, t: float) -> None:
        """A control-plane warm of ``adapter`` on ``node`` at ``t`` (the agent's load: S3 to disk when missing, the
        node's rule for room, ``add_lora``), counted as a load outside requests; nothing when its engine holds it."""
        if adapter in node.engine.cpu:
            return
        size = self.sizes[adapter]
        if adapter not in node.disk:
            self.extra_fetches += 1
            self.extra_bytes += size
            for victim in self.disk_victim(node, size, t):
                node.disk_used -= node.disk.pop(victim)
            node.disk[adapter] = size
            node.disk_used += size
        if len(node.engine.cpu) >= node.engine.max_cpu_loras:
            self.make_room(node, adapter, t)
        node.engine.add_lora(adapter)
        self.extra_loads += 1
        self.extra_bytes += size
        self.loaded(node, adapter, t)

    def choose(self, adapter: int, t: float) -> SimNode:
        """The gateway's choice (``GatewayApp.node_for``): ``route`` over ``plan_candidates`` (the nodes that serve
        the version, by name or in an engine, and the plan's homes that do not). A home that does not serve it yet
        gets a warm behind the request (ready ``warm_s`` later, asked at most every ``REWARM_S`` per node) while the
        request goes where ``route`` puts it among the holders; when no node serves it, it is warmed where
        ``warm_target`` says and the request waits for it there (``warmed``)."""
        self.window[adapter] = self.window.get(adapter, 0) + 1
        if self.reconciler is not None:
            self._seen.setdefault(adapter, deque()).append(t)
        self.warmed = False
        homes = self.plan.get(adapter, ())
        weights = self._weights.get(adapter)
        if weights is None:
            weights = self._weights[adapter] = tuple(_hrw(self.ids[adapter], n.name) for n in self.nodes)
        holders: list[Candidate] = []
        missing: list[Candidate] = []
        for n, w in zip(self.nodes, weights, strict=True):
            serves = adapter in n.disk or adapter in n.engine.cpu
            if not serves and n.name not in homes:
                continue
            in_batch, full = n.batch_room(adapter)
            c = Candidate(n.name, n.tier(adapter) if serves else Tier.COLD, n.engine.max_loras, len(n.engine.gpu),
                          *n.load_figures(), True, w, in_batch, full)
            (holders if serves else missing).append(c)
        decision = route(plan_candidates(holders, missing, homes), config=self.routing)
        if decision is None:  # no node serves it: warm_for_request, and the request waits for that warm
            home = warm_target(self.ids[adapter], r=self.ranks[adapter], candidates=self._warm_candidates,
                               homes=homes)
            assert home is not None
            self.warmed = True
            return self.by_name[home]
        if decision.tier is Tier.COLD:  # a move: warm the home behind the request, serve it where it is
            self._move(adapter, decision.node, t)
            decision = route(plan_candidates(holders, (), ()), config=self.routing)
            assert decision is not None
        return self.by_name[decision.node]

    def unload(self, node: SimNode, adapter: int) -> None:
        """An operator's eviction of ``adapter`` from ``node`` (``inference.fleet.warming.placement_evict``): out of
        the engine, and its placement ``staged`` and not served, so routing no longer counts the node a holder (the
        file stays on the node's disk, but nothing is served from it)."""
        node.engine.remove_lora(adapter)
        if adapter in node.disk:
            node.disk_used -= node.disk.pop(adapter)

    def upload_warms(self, order: Sequence[int]) -> None:
        """The warms a fleet performs as versions become ready (``inference.fleet.warming.placement_on_ready``):
        each adapter of ``order`` in turn loaded on ``warm_target``'s node (no plan yet: its HRW-first node), the
        node's rule making room. Before the trace: nothing is counted."""
        for adapter in order:
            home = warm_target(self.ids[adapter], r=self.ranks[adapter], candidates=self._warm_candidates,
                               homes=self.plan.get(adapter, ()))
            if home is not None:
                self._load(self.by_name[home], adapter, 0.0)
        self.extra_loads = self.extra_fetches = self.extra_bytes = 0

    def _move(self, adapter: int, name: str, t: float) -> None:
        """The gateway's background warm of ``adapter`` on its new home ``name`` (``GatewayApp._move``), at most
        once per ``REWARM_S`` per (adapter, node) while it is not done."""
        if self._asked.get((adapter, name), -1.0) > t:
            return
        self._asked[adapter, name] = t + REWARM_S
        heapq.heappush(self._warms, (t + self.warm_s, adapter, name))

    def _node_resident(self, node: SimNode, v: int, t: float) -> NodeResident:
        """What the node's rule sees of ``v`` on ``node`` at ``t`` (``inference.node.worker_ext.policy_victim``)."""
        rec = self.res[node.name].get(v)
        if rec is None:  # loaded by a pre-warm and never requested here
            rec = self.res[node.name][v] = [-1e12, 0.0, t, 0.0, -1e12, 0.0]
        last, hits, hits_at, total, loaded_at, at_load = rec
        idle = t - max(last, loaded_at)
        planned = self.plan.get(v)
        return NodeResident(v, self.sizes[v], idle_s=idle,
                            requests=decayed_hits(hits, hits_at, t, self.eviction.half_life_s),
                            busy=node.busy(v, t),
                            fresh=is_fresh(loaded_ago_s=t - loaded_at, requests_since_load=total - at_load,
                                           idle_s=idle, grace_s=self.grace_s),
                            planned_elsewhere=bool(planned) and node.name not in (planned or ()))

    def make_room(self, node: SimNode, adapter: int, t: float) -> None:
        """Evict by the node's rule before the engine's LRU would (which decides when every resident is busy)."""
        residents = [self._node_resident(node, v, t) for v in node.engine.cpu]
        for victim in node_victims(residents, capacity=node.engine.max_cpu_loras, now_s=t, config=self.eviction):
            node.engine.remove_lora(victim)

    def loaded(self, node: SimNode, adapter: int, t: float) -> None:
        """Start the load's grace: the adapter's request count now is its baseline."""
        rec = self.res[node.name].setdefault(adapter, [-1e12, 0.0, t, 0.0, -1e12, 0.0])
        rec[4], rec[5] = t, rec[3]

    def served(self, node: SimNode, adapter: int, t: float) -> None:
        """Count the request on ``node`` (decayed and in all) and its recency."""
        rec = self.res[node.name].get(adapter)
        if rec is None:
            self.res[node.name][adapter] = [t, 1.0, t, 1.0, -1e12, 0.0]
            return
        rec[1] = decayed_hits(rec[1], rec[2], t, self.eviction.half_life_s) + 1.0
        rec[0], rec[2] = t, t
        rec[3] += 1.0


BASELINES: dict[str, type[Policy]] = {
    p.name: p for p in (RandomPolicy, RoundRobinPolicy, TodayPolicy, LruWhereLoadedPolicy)
}
