"""Which nodes should hold each adapter version: rendezvous hashing with bounded load and rate-driven replicas.

- *Eligible nodes* serve the version's base model, accept its rank (``r ≤ --max-lora-rank``, the engine rejects the
  rest: ``vllm/lora/peft_helper.py``) and have the bytes for it.
- *Order*: the version's HRW ranking of the eligible nodes (``inference.fleet.hrw``): stable, and a lost node only
  remaps the versions that had it (shared/notes/fleet.md §3).
- *Replicas*: ``k = ceil(rate / (replica_util × mean node rate))`` clamped to ``[min_replicas, max_replicas]`` and the
  eligible count: one replica while a version fits in a share of one node, more as its request rate grows, back to
  ``min_replicas`` when it goes idle (k-replica HRW sets: shared/notes/fleet.md §7.4).
- *Bounded load*: versions are placed hottest first; a node is skipped while its assigned rate would pass
  ``load_bound`` × the mean node rate, or its engine CPU slots (``max_cpu_loras``) are already promised to hotter
  versions (consistent hashing with bounded loads, Mirrokni, Thorup, Zadimoghaddam, SODA 2018). So the hottest
  ``Σ max_cpu_loras`` versions spread over distinct CPU slots — the most an online cache can hold — and no node is
  handed more than its share of traffic.
- *Pins*: nodes a version is pinned on are always in its set, before the hashed ones.
- *Stickiness*: nodes already holding the version are tried before the hash order, so re-planning on noisy rates
  does not shuffle versions between nodes (every move is an engine load).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inference.fleet.hrw import hrw_order


@dataclass(frozen=True, slots=True)
class PlacementNode:
    """A live node as placement sees it.

    Attributes:
        name: node name.
        base_model: the engine's base model name.
        max_lora_rank: the engine's ``--max-lora-rank``.
        cpu_slots: the engine's ``max_cpu_loras`` (versions it can hold in its CPU cache).
        cpu_bytes: byte budget of its CPU cache, or None for "count only".
    """

    name: str
    base_model: str
    max_lora_rank: int
    cpu_slots: int
    cpu_bytes: int | None = None


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


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Placement knobs.

    Attributes:
        load_bound: ``c`` in bounded loads: a node takes at most ``c`` × the mean node rate (1.02 = 2 % headroom;
            docs/placement.md shows the sweep that chose it against loads and balance).
        replica_util: one replica may carry this share of a mean node's rate before another is added (0.25: the
            hottest versions get a second replica early, which evens out request counts; same sweep).
        max_replicas: default ceiling on ``k``.
    """

    load_bound: float = 1.02
    replica_util: float = 0.25
    max_replicas: int = 4


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
    by_base: dict[str, float] = {}
    for d in demands:
        by_base[d.base_model] = by_base.get(d.base_model, 0.0) + d.rate
    nodes_per_base: dict[str, int] = {}
    for n in nodes:
        nodes_per_base[n.base_model] = nodes_per_base.get(n.base_model, 0) + 1
    load: dict[str, float] = {n.name: 0.0 for n in nodes}
    slots: dict[str, int] = {n.name: 0 for n in nodes}
    used_bytes: dict[str, int] = {n.name: 0 for n in nodes}
    node_by_name: Mapping[str, PlacementNode] = {n.name: n for n in nodes}
    result: dict[int, tuple[str, ...]] = {}
    ordered = sorted(demands, key=lambda d: (not d.pinned_nodes, -d.rate, d.version_id))
    for d in ordered:
        eligible = [n.name for n in nodes if is_eligible(d, n)]
        if not eligible:
            result[d.version_id] = ()
            continue
        eligible = hrw_order(d.version_id, eligible)
        if d.resident_on:
            eligible.sort(key=lambda name, held=d.resident_on: name not in held)  # type: ignore[misc]
        mean = by_base[d.base_model] / nodes_per_base[d.base_model]
        k = replicas_wanted(d.rate, mean, config=config, min_replicas=d.min_replicas,
                            max_replicas=d.max_replicas, eligible=len(eligible))
        chosen = [name for name in eligible if name in d.pinned_nodes]
        share = d.rate / max(k, len(chosen), 1)
        cap = config.load_bound * mean

        def fits(name: str, check_slots: bool, check_load: bool, d: Demand = d, share: float = share,
                 cap: float = cap) -> bool:
            node = node_by_name[name]
            if check_load and load[name] + share > cap + 1e-12:
                return False
            if check_slots and slots[name] >= node.cpu_slots:
                return False
            return not (check_slots and node.cpu_bytes is not None
                        and used_bytes[name] + d.size_bytes > node.cpu_bytes)

        if d.rate > 0:
            for check_slots, check_load in ((True, True), (False, True), (False, False)):
                for name in eligible:
                    if len(chosen) >= k:
                        break
                    if name not in chosen and fits(name, check_slots, check_load):
                        chosen.append(name)
            for name in chosen:
                load[name] += share
                slots[name] += 1
                used_bytes[name] += d.size_bytes
        elif not chosen:
            # Idle: its HRW-first node, without promising it a CPU slot.
            chosen = eligible[:k]
        result[d.version_id] = tuple(chosen)
    return result
