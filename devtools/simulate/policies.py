"""Policies under test. ``quiver`` calls the production decisions; the baselines leave eviction to vLLM's LRU.

- ``quiver``: ``inference.policy.placement.place`` every ``replan_s`` over decayed request rates (what the
  reconciler does), ``inference.policy.routing.route`` per request, ``inference.policy.eviction.choose_victims`` before
  each engine load (the agent removes the victims, so the engine's own LRU never picks) and for the disk cache.
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
from inference.policy.eviction import EvictionConfig, EvictionPolicy, Resident, choose_victims, decayed_hits
from inference.policy.hrw import hrw_weight
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
        """Disk entries to drop for ``incoming`` bytes; default LRU."""
        out, used = [], node.disk_used
        for key, size in node.disk.items():
            if used + incoming <= node.disk_bytes:
                break
            out.append(key)
            used -= size
        return out

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
                 placement: PlacementConfig | None = None, routing: RouteConfig | None = None) -> None:
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
        self.res: dict[str, dict[int, Resident]] = {n.name: {} for n in nodes}
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
        self._refresh_desired()
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
                self.served(node, adapter, t)

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

    def _resident(self, node: SimNode, v: int) -> Resident:
        r = self.res[node.name].get(v)
        if r is None:  # never served here (cannot happen in a run; kept for safety)
            r = Resident(v, self.tenants[v], self.sizes[v], desired=node.name in self._placed(v))
        return r

    def make_room(self, node: SimNode, adapter: int, t: float) -> None:
        """Evict by the configured policy before the engine's LRU would."""
        residents = [self._resident(node, v) for v in node.engine.cpu]
        for victim in choose_victims(residents, slots=node.engine.max_cpu_loras, budget_bytes=None,
                                     incoming_bytes=self.sizes[adapter], now_s=t, config=self.eviction):
            node.engine.remove_lora(victim)

    def disk_victim(self, node: SimNode, incoming: int, t: float) -> list[int]:
        """Disk entries by the same policy, under the node's disk byte budget."""
        if node.disk_used + incoming <= node.disk_bytes:
            return []
        residents = [self._resident(node, v) for v in node.disk]
        return list(choose_victims(residents, slots=len(residents) + 1, budget_bytes=node.disk_bytes,
                                   incoming_bytes=incoming, now_s=t, config=self.eviction))

    def served(self, node: SimNode, adapter: int, t: float) -> None:
        """Refresh the version's resident record on ``node`` (decayed hits, recency, reload cost, desired)."""
        old = self.res[node.name].get(adapter)
        hits = 1.0 if old is None else decayed_hits(old.hits, old.hits_at_s, t, self.eviction.half_life_s) + 1.0
        size = self.sizes[adapter]
        reload_ms = self.costs.disk_to_cpu_ms(size) + (0.0 if adapter in node.disk else self.costs.s3_to_disk_ms(size))
        desired = old.desired if old is not None else node.name in self._placed(adapter)
        self.res[node.name][adapter] = Resident(adapter, self.tenants[adapter], size, False, t, hits, t, reload_ms,
                                                desired)

    def _refresh_desired(self) -> None:
        for node in self.nodes:
            records = self.res[node.name]
            for v, r in records.items():
                desired = node.name in self._placed(v)
                if desired != r.desired:
                    records[v] = r._replace(desired=desired)


BASELINES: dict[str, type[Policy]] = {
    p.name: p for p in (RandomPolicy, RoundRobinPolicy, TodayPolicy, LruWhereLoadedPolicy)
}
