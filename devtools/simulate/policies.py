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

import random
from collections.abc import Sequence
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
from inference.policy.routing import Candidate, RouteConfig, route

BASE = "base"


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

    # Loads, S3 fetches and bytes the policy caused outside requests (the reconciler's pre-warms).
    extra_loads = 0
    extra_fetches = 0
    extra_bytes = 0


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
                 grace_s: float = 5.0) -> None:
        super().__init__(nodes, seed=seed)
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
        """Re-plan every ``replan_s`` seconds, as the reconciler would on Celery beat."""
        if t - self.last_plan < self.replan_s:
            return
        span = t - self.last_plan
        keep = self.rate_memory
        for adapter in set(self.rates) | set(self.window):
            self.rates[adapter] = keep * self.rates.get(adapter, 0.0) + (1 - keep) * self.window.get(adapter, 0) / span
        self.window.clear()
        held: dict[int, set[str]] = {}
        for n in self.nodes:
            for a in n.engine.cpu:
                held.setdefault(a, set()).add(n.name)
        demands = [Demand(a, BASE, self.ranks[a], self.sizes[a], rate, resident_on=frozenset(held.get(a, ())),
                          planned_on=frozenset(self.plan.get(a, ())))
                   for a, rate in self.rates.items() if rate > 1e-4]
        self.plan = place(demands, self.pnodes, config=self.placement)
        self.last_plan = t
        if self.prewarm:
            self._prewarm(t, slotted(self.plan, demands, self.pnodes))

    def _prewarm(self, t: float, fits: frozenset[tuple[int, str]]) -> None:
        """The reconciler's warm tasks (``fleet_reconcile._prewarm``; the simulator has no operator intent): every
        replica of a replicated version within the nodes' CPU slots (``slotted``) that its engine lacks is loaded."""
        for adapter, names in self.plan.items():
            if len(names) < 2:
                continue
            for name in names:
                node = self.by_name[name]
                if (adapter, name) not in fits or adapter in node.engine.cpu:
                    continue
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

    def _placed(self, adapter: int) -> tuple[str, ...]:
        placed = self.plan.get(adapter)
        if placed is None:
            # Not in the plan yet: where production warms it (``inference.fleet.warming.warm_target_node``).
            home = warm_target(adapter, r=self.ranks[adapter], candidates=self._warm_candidates)
            placed = (home,) if home is not None else ()
        return placed

    def choose(self, adapter: int, t: float) -> SimNode:
        """``route`` over every node, marking the version's replica set."""
        self.window[adapter] = self.window.get(adapter, 0) + 1
        placed = self._placed(adapter)
        weights = self._weights.get(adapter)
        if weights is None:
            weights = self._weights[adapter] = tuple(_hrw(adapter, n.name) for n in self.nodes)
        candidates = [
            Candidate(n.name, n.tier(adapter), n.engine.max_loras, len(n.engine.gpu), *n.load_figures(),
                      n.name in placed, w)
            for n, w in zip(self.nodes, weights, strict=True)
        ]
        decision = route(candidates, config=self.routing)
        assert decision is not None
        return self.by_name[decision.node]

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
                            busy=node.busy_until.get(v, 0.0) > t,
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
