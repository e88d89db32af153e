"""Which nodes should hold each adapter version: rendezvous hashing with bounded load and rate-driven replicas.

- *Eligible nodes* serve the version's base model, accept its rank (``r ≤ --max-lora-rank``, the engine rejects the
  rest: ``vllm/lora/peft_helper.py``) and have the bytes for it.
- *Order*: the version's HRW ranking of the eligible nodes (``inference.policy.hrw``): stable, and a lost node only
  remaps the versions that had it (Thaler and Ravishankar, "A Name-Based Mapping Scheme for
  Rendezvous", 1996).
- *Replicas*: ``k = ceil(rate / (replica_util × mean node rate))`` clamped to ``[min_replicas, max_replicas]`` and the
  eligible count: one replica while a version fits in a share of one node, more as its request rate grows, back to
  ``min_replicas`` when it goes idle (k-replica HRW sets, as Dynamo proposes
  in ``ai-dynamo/dynamo#15031``).
- *First replicas first* while the fleet's CPU slots can hold every version with traffic: each gets one replica
  (more only when the load bound or the operator's floor forces it) before any gets a rate-driven extra one, and
  extra replicas go into free CPU slots only.
- *Bounded load*: versions are placed hottest first; a node is skipped while its assigned rate would pass
  ``load_bound`` × the mean node rate, or its engine CPU slots (``max_cpu_loras``) are already promised to hotter
  versions (consistent hashing with bounded loads, Mirrokni, Thorup, Zadimoghaddam, SODA 2018). So the hottest
  ``Σ max_cpu_loras`` versions spread over distinct CPU slots — the most an online cache can hold — and no node is
  handed more than its share of traffic.
- *Batch slots*: the ``Σ max_loras`` hottest versions (the GPU-slot frontier) go at most ``max_loras`` to a node
  while another node has room for one: vLLM's scheduler runs at most ``max_loras`` adapters in a batch and defers a
  request whose adapter does not fit (``vllm/v1/core/sched/scheduler.py``), so a node handed three of the four
  hottest versions for two slots kept one of them waiting behind the other two (bench_fleet: 2 nodes × 2 slots).
- *Pins*: nodes a version is pinned on are always in its set, before the hashed ones.
- *Stickiness*: nodes already holding the version are tried before the hash order, so re-planning on noisy rates
  does not shuffle versions between nodes (every move is an engine load); among several holders, the ones the
  previous plan chose come first. Holding alone is not enough: a round-robin front or a failover leaves copies
  everywhere, and the hottest version flipped between its two holders on re-plans (bench_fleet). A margin over the
  load bound for previous homes (hysteresis) saved more loads in the simulator (112 vs 123 per 1,000) but cost
  balance past GIE's on other seeds (1.030 vs 1.019), so there is none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inference.policy.hrw import hrw_order


@dataclass(frozen=True, slots=True)
class PlacementNode:
    """A live node as placement sees it.

    Attributes:
        name: node name.
        base_model: the engine's base model name.
        max_lora_rank: the engine's ``--max-lora-rank``.
        cpu_slots: the engine's ``max_cpu_loras`` (versions it can hold in its CPU cache).
        cpu_bytes: byte budget of its CPU cache, or None for "count only".
        gpu_slots: the engine's ``max_loras`` (adapters one batch can hold), or 0 to leave them out of the plan.
    """

    name: str
    base_model: str
    max_lora_rank: int
    cpu_slots: int
    cpu_bytes: int | None = None
    gpu_slots: int = 0


@dataclass(frozen=True, slots=True)
class Demand:
    """One servable version and what is wanted of it.

    Attributes:
        version_id: ``AdapterVersion.pk`` (= ``lora_int_id``).
        base_model: its base model name.
        r: its PEFT rank.
        size_bytes: bytes of its weights (``adapter_model.safetensors``).
        rate: its recent request rate, requests/s (an exponentially decayed count over a window; the caller's).
        min_replicas: operator's floor (desired state), ≥ 1 while the version is servable.
        max_replicas: operator's ceiling, or None for the config's.
        pinned_nodes: nodes the operator pinned it on.
        resident_on: nodes whose engine holds it now (observed state); they are tried first, so a re-plan moves
            a version only when its current nodes no longer fit (no churn from rate noise).
        planned_on: the nodes the previous plan gave it (derived state); among the ``resident_on`` nodes these
            are tried first. A version held nowhere keeps its HRW order (the last plan's choices spread the tail
            less evenly: simulator imbalance 1.013 vs 1.009 when they led).
    """

    version_id: int
    base_model: str
    r: int
    size_bytes: int
    rate: float
    min_replicas: int = 1
    max_replicas: int | None = None
    pinned_nodes: frozenset[str] = field(default_factory=frozenset)
    resident_on: frozenset[str] = field(default_factory=frozenset)
    planned_on: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Placement knobs.

    Attributes:
        load_bound: ``c`` in bounded loads: a node takes at most ``c`` × the mean node rate (1.02 = 2 % headroom;
            docs/placement.md shows the sweep that chose it against loads and balance).
        replica_util: one replica may carry this share of a mean node's rate before another is added (0.25: the
            hottest versions get a second replica early, which evens out request counts; same sweep).
        max_replicas: default ceiling on ``k``.
        replica_worth: where the fleet's CPU slots cannot hold every version with traffic, a rate-driven extra
            replica takes the slot of the coldest version that had one, which then reloads on each of its requests.
            It is granted only while each replica would still carry at least this many times that version's rate
            (the slot frontier). Same sweep: 500 versions over 256 slots replicate the head (frontier ~0.06 % of
            traffic); 16 over 8 (scripts/bench_fleet, frontier ~4 %) do not.
        miss_cost: the extra work a request costs its node when it needs an engine load, in requests (a load's
            time over a request's). Versions colder than the slot frontier are booked at rate × (1 + miss_cost),
            so the load bound spreads reloads as well as requests; at 0 one node could get the hot versions and
            the other every reload (scripts/bench_fleet).
    """

    load_bound: float = 1.02
    replica_util: float = 0.25
    max_replicas: int = 4
    replica_worth: float = 8.0
    miss_cost: float = 0.0


def is_eligible(demand: Demand, node: PlacementNode) -> bool:
    """True when ``node`` can load ``demand``: same base model, ``r ≤ max_lora_rank``, bytes within its budget."""
    if node.base_model != demand.base_model or demand.r > node.max_lora_rank:
        return False
    return node.cpu_bytes is None or demand.size_bytes <= node.cpu_bytes


def replicas_wanted(rate: float, mean_node_rate: float, *, config: PlacementConfig, min_replicas: int = 1,
                    max_replicas: int | None = None, eligible: int) -> int:
    """How many nodes should hold a version with ``rate`` requests/s when the mean node gets ``mean_node_rate``.

    Returns:
        ``k`` in ``[min(min_replicas, eligible), eligible]``; 0 only when no node is eligible.
    """
    if eligible <= 0:
        return 0
    ceiling = min(eligible, max_replicas if max_replicas is not None else config.max_replicas)
    per_replica = config.replica_util * mean_node_rate
    k = math.ceil(rate / per_replica) if per_replica > 0 and rate > 0 else 1
    return max(1, min(eligible, max(min_replicas, min(k, ceiling))))


def place(demands: Sequence[Demand], nodes: Sequence[PlacementNode], *,
          config: PlacementConfig = PlacementConfig()) -> dict[int, tuple[str, ...]]:
    """The replica set of every demand.

    Args:
        demands: servable versions with their rates and operator intent.
        nodes: live nodes.
        config: knobs.

    Returns:
        ``{version_id: (node, …)}``, preferred node first; a version no node can load maps to ``()``.
    """
    slot_total: dict[str, int] = {}
    for n in nodes:
        slot_total[n.base_model] = slot_total.get(n.base_model, 0) + n.cpu_slots
    frontier = _slot_frontier(demands, slot_total)
    gpu_total: dict[str, int] = {}
    for n in nodes:
        gpu_total[n.base_model] = gpu_total.get(n.base_model, 0) + n.gpu_slots
    gpu_frontier = _slot_frontier(demands, gpu_total, all_fit=0.0)
    hot_cap = {n.name: n.gpu_slots for n in nodes}
    hot_held: dict[str, int] = {n.name: 0 for n in nodes}

    def is_hot(d: Demand) -> bool:
        return d.rate > 0 and d.rate >= gpu_frontier.get(d.base_model, float("inf"))
    # What a version costs the fleet: its rate, times 1 + miss_cost when it is colder than the slot frontier (no
    # CPU slot for it anywhere: each of its requests is an engine load). This sizes the mean node's share.
    cost = {d.version_id: d.rate * (1.0 + config.miss_cost) if 0 < d.rate < frontier.get(d.base_model, 0.0)
            else d.rate for d in demands}
    by_base: dict[str, float] = {}
    for d in demands:
        by_base[d.base_model] = by_base.get(d.base_model, 0.0) + cost[d.version_id]
    nodes_per_base: dict[str, int] = {}
    for n in nodes:
        nodes_per_base[n.base_model] = nodes_per_base.get(n.base_model, 0) + 1
    load: dict[str, float] = {n.name: 0.0 for n in nodes}
    slots: dict[str, int] = {n.name: 0 for n in nodes}
    used_bytes: dict[str, int] = {n.name: 0 for n in nodes}
    node_by_name: Mapping[str, PlacementNode] = {n.name: n for n in nodes}
    result: dict[int, tuple[str, ...]] = {}
    ordered = sorted(demands, key=lambda d: (not d.pinned_nodes, -d.rate, d.version_id))
    plans: list[tuple[Demand, list[str], list[str], int, float]] = []  # demand, chosen, eligible, k, cap

    booked: dict[tuple[int, str], float] = {}
    slot_cap = {n.name: n.cpu_slots for n in nodes}
    miss_factor = 1.0 + config.miss_cost

    def node_cost(d: Demand, name: str) -> float:
        # What it costs this node: past the node's own CPU slots (hotter versions took them, since they are placed
        # first) each request reloads, wherever the fleet's frontier is (bench_fleet: a node handed 10 versions
        # for 4 slots did three times the other's loads while the plan counted them as hits).
        if config.miss_cost and d.rate > 0 and slots[name] >= slot_cap[name]:
            return d.rate * miss_factor
        return cost[d.version_id]

    def fits(d: Demand, name: str, share: float, target: int, cap: float, check_slots: bool,
             check_load: bool) -> bool:
        full = slots[name] >= slot_cap[name]
        if check_slots:
            if full or (hot_cap[name] and is_hot(d) and hot_held[name] >= hot_cap[name]):
                return False
            budget = node_by_name[name].cpu_bytes
            if budget is not None and used_bytes[name] + d.size_bytes > budget:
                return False
        if not check_load:
            return True
        if full and config.miss_cost and d.rate > 0:
            share = d.rate * miss_factor / target
        return load[name] + share <= cap + 1e-12

    def book(d: Demand, chosen: list[str], sign: int) -> None:
        for name in chosen:
            if sign > 0:
                booked[d.version_id, name] = node_cost(d, name) / len(chosen)
                load[name] += booked[d.version_id, name]
            else:
                load[name] -= booked.pop((d.version_id, name))
            slots[name] += sign
            used_bytes[name] += sign * d.size_bytes
            if is_hot(d):
                hot_held[name] += sign

    def grow(d: Demand, chosen: list[str], eligible: list[str], target: int, cap: float,
             passes: Sequence[tuple[bool, bool]]) -> None:
        share_of = max(target, len(chosen), 1)
        share = cost[d.version_id] / share_of
        for check_slots, check_load in passes:
            for name in eligible:
                if len(chosen) >= target:
                    return
                if name not in chosen and fits(d, name, share, share_of, cap, check_slots, check_load):
                    chosen.append(name)

    # Where the fleet's CPU slots can hold every version with traffic once, every such version gets its slot
    # before any gets a rate-driven second replica (one without a slot reloads on each of its requests; an extra
    # replica only evens out load), and a free slot past the load bound beats a full node. Only the load bound (a
    # version hotter than one node may carry) or the operator's floor adds replicas in this first pass. Where they
    # cannot, some version reloads anyway, and the hottest versions' replicas are worth the coldest one's slot:
    # every replica is placed at once (the simulator's 500 versions over 256 slots: docs/placement.md).
    active: dict[str, int] = {}
    for d in demands:
        if d.rate > 0 or d.pinned_nodes:
            active[d.base_model] = active.get(d.base_model, 0) + 1
    # Nodes by base model, and the eligible names per (base model, rank, bytes): is_eligible once per node and
    # kind of demand, not once per node and demand (2,000 versions × 64 nodes was 128,000 calls a pass).
    nodes_of: dict[str, list[PlacementNode]] = {}
    for n in nodes:
        nodes_of.setdefault(n.base_model, []).append(n)
    eligible_of: dict[tuple[str, int, int], tuple[str, ...]] = {}
    budgeted = {n.base_model for n in nodes if n.cpu_bytes is not None}  # elsewhere the bytes decide nothing
    for d in ordered:
        kind = (d.base_model, d.r, d.size_bytes if d.base_model in budgeted else 0)
        names = eligible_of.get(kind)
        if names is None:
            names = eligible_of[kind] = tuple(n.name for n in nodes_of.get(d.base_model, ()) if is_eligible(d, n))
        if not names:
            result[d.version_id] = ()
            continue
        eligible = hrw_order(d.version_id, names)
        if d.resident_on:
            # Holders first; among several holders, the previous plan's (a version held nowhere keeps its HRW order,
            # which spreads the tail better than the last plan's choices did: the simulator's imbalance). A stable
            # partition, as the sort by (not held, not (held and planned)) was, without a key call per node.
            held, homes = d.resident_on, d.planned_on
            eligible = ([n for n in eligible if n in held and n in homes]
                        + [n for n in eligible if n in held and n not in homes]
                        + [n for n in eligible if n not in held])
        mean = by_base[d.base_model] / nodes_per_base[d.base_model]
        k = replicas_wanted(d.rate, mean, config=config, min_replicas=d.min_replicas,
                            max_replicas=d.max_replicas, eligible=len(eligible))
        chosen = [name for name in eligible if name in d.pinned_nodes]
        cap = config.load_bound * mean
        if d.rate > 0:
            if active.get(d.base_model, 0) <= slot_total.get(d.base_model, 0):
                forced = math.ceil(cost[d.version_id] / cap - 1e-9) if cap > 0 else 1
                first = min(k, max(1, forced, min(d.min_replicas, len(eligible))))
                grow(d, chosen, eligible, first, cap, ((True, True), (True, False), (False, True), (False, False)))
                plans.append((d, chosen, eligible, k, cap))
            else:
                forced = max(1, math.ceil(cost[d.version_id] / cap - 1e-9) if cap > 0 else 1, min(d.min_replicas, len(eligible)))
                edge = config.replica_worth * frontier.get(d.base_model, 0.0)
                while k > forced and d.rate / k < edge:
                    k -= 1
                grow(d, chosen, eligible, k, cap, ((True, True), (False, True), (False, False)))
            book(d, chosen, +1)
        elif not chosen:
            # Idle: its HRW-first node, without promising it a CPU slot.
            chosen = eligible[:k]
        result[d.version_id] = tuple(chosen)
    # Then the rate-driven extra replicas, hottest first, into free CPU slots only: one that took a slot from a
    # colder version made it reload on each of its requests (scripts/bench_fleet: 8 versions, 8 slots).
    for d, chosen, eligible, k, cap in plans:
        if len(chosen) < k:
            book(d, chosen, -1)
            grow(d, chosen, eligible, k, cap, ((True, True), (True, False)))
            book(d, chosen, +1)
            result[d.version_id] = tuple(chosen)
    return result


def _slot_frontier(demands: Sequence[Demand], slot_total: Mapping[str, int], *,
                   all_fit: float | None = None) -> dict[str, float]:
    """Per base model, the rate of the coldest version that still gets a slot when the ``slot_total`` slots go to
    the hottest versions one each. Where every version with traffic fits: absent, or ``all_fit`` when given."""
    rates: dict[str, list[float]] = {}
    for d in demands:
        if d.rate > 0:
            rates.setdefault(d.base_model, []).append(d.rate)
    out: dict[str, float] = {}
    for base, values in rates.items():
        slots = slot_total.get(base, 0)
        if 0 < slots < len(values):
            out[base] = sorted(values, reverse=True)[slots - 1]
        elif slots > 0 and all_fit is not None:
            out[base] = all_fit
    return out


def slotted(plan: Mapping[int, tuple[str, ...]], demands: Sequence[Demand],
            nodes: Sequence[PlacementNode]) -> frozenset[tuple[int, str]]:
    """The ``(version_id, node)`` pairs of ``plan`` that fit the nodes' engine CPU slots when pinned versions take
    them first and the rest go hottest first (the order ``place`` books them in).

    The reconcile loop pre-warms only these: where more versions have traffic than the fleet has CPU slots, the plan
    still names a node for the coldest ones (where their requests go), but loading them ahead of demand would evict a
    hotter version that then reloads — the reconciler thrashing the caches itself (scripts/bench_fleet: 16 versions
    over 8 slots, a warm for each of the 8 outside the engines on every pass).
    """
    free = {n.name: n.cpu_slots for n in nodes}
    out: set[tuple[int, str]] = set()
    for d in sorted(demands, key=lambda d: (not d.pinned_nodes, -d.rate, d.version_id)):
        for name in plan.get(d.version_id, ()):
            if free.get(name, 0) > 0:
                free[name] -= 1
                out.add((d.version_id, name))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class WarmCandidate:
    """A live node that could load a version a request is waiting for.

    Attributes:
        name: node name.
        max_lora_rank: the engine's ``--max-lora-rank`` (a larger ``r`` is refused by vLLM).
        failed: its last load of this version failed (placement ``errored``).
    """

    name: str
    max_lora_rank: int
    failed: bool = False


def warm_target(version_id: int, *, r: int, candidates: Sequence[WarmCandidate], homes: Sequence[str] = (),
                named: str | None = None) -> str | None:
    """The node that loads ``version_id`` now, because a request (or a newly ready version) needs it somewhere.

    The gateway (through ``inference.fleet.warming.warm_for_request``), a new version's first placement
    (``placement_on_ready``) and ``scripts/simulate`` all ask this one function.

    Args:
        version_id: the version's ``lora_int_id`` (its HRW key, as in :func:`place`).
        r: the adapter's rank; nodes with a smaller ``max_lora_rank`` are not eligible.
        candidates: the live nodes of the version's base model.
        homes: the reconciler's last plan for the version, preferred first (``[]`` when it has none).
        named: a node asked for by name (the router's pick, or the node an earlier ask chose); kept while live.

    Returns:
        ``named`` when it is a candidate; else the first eligible home whose load did not fail; else the version's
        HRW-first eligible node (loads that failed last), which is the node :func:`place` puts a one-replica version
        on when no load bound applies. None when no candidate is eligible.
    """
    live = {c.name: c for c in candidates}
    if named is not None and named in live:
        return named
    eligible = {name: c for name, c in live.items() if c.max_lora_rank >= r}
    for home in homes:
        c = eligible.get(home)
        if c is not None and not c.failed:
            return home
    ranked = hrw_order(version_id, eligible)
    ranked.sort(key=lambda name: eligible[name].failed)  # stable: HRW order within each group
    return ranked[0] if ranked else None
