"""Pick the node for one request: residency first, then load, never a saturated node while another qualifies.

Scores per candidate node (first match wins), after llm-d's proposed ``lora-load-state-scorer``
(llm-d/llm-d-router#2792): version in a GPU slot 1.0, in the engine's CPU cache 0.7, a free GPU slot 0.6, staged on
the node's disk 0.3, otherwise 0.0. Filters before scoring:

- *saturation*: ``num_requests_waiting >= queue_saturated`` or ``kv_cache_usage_perc >= kv_saturated`` (GIE's
  saturation detector defaults, queue 5 and KV 0.8: llm-d-router ``saturationdetector/utilization/config.go``);
- *bounded load*: a node carrying more than ``load_bound`` × the mean load of the candidates (+1) is skipped, as in
  consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018), so one hot adapter cannot
  pile onto one node.

A node whose running batch has no room for the version (``max_loras`` other adapters running there) loses to any
node that holds it with room: vLLM's scheduler defers such a request until one of those adapters drains, and keeps
admitting their new requests meanwhile (``vllm/v1/core/sched/scheduler.py``), while a load from the node's disk or
CPU cache costs about a millisecond on the CPU node and far less than a wait for a batch on a GPU (scripts/bench_fleet
measures both; GIE's LoRA affinity scores an active adapter 1.0 and room for one more 0.8: llm-d-router
``scorer/loraaffinity/lora_affinity.go``).
Nodes in the version's placement (its HRW replica set, ``inference.policy.placement``) win over spill-over nodes;
then nodes that hold the version in the engine (GPU slot or CPU cache: no engine load); among those the less loaded
node wins before the GPU/CPU difference, because a CPU→GPU swap (~0.1 s) costs less than queueing and because
GPU-first would send all of a replicated version's traffic to the one replica that happens to hold a slot, starving
the others out of the engine; among in-engine nodes one whose batch already runs the version comes first. Then the score, then the higher HRW weight — never a random pick, which turns routing
random at low load (llm-d/llm-d-router#1500). Requests for the base model go where the fewest GPU LoRA
slots are busy (#2792), then the least loaded.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from inference.policy.tiers import IN_ENGINE, Tier

# llm-d/llm-d-router#2792 tiers; ERRORED never serves.
TIER_SCORE: dict[Tier, float] = {Tier.GPU: 1.0, Tier.CPU: 0.7, Tier.DISK: 0.3, Tier.COLD: 0.0, Tier.ERRORED: -1.0}
FREE_SLOT_SCORE = 0.6


class Candidate(NamedTuple):
    """One node that could serve the request, as the control plane last saw it (immutable; a NamedTuple because
    one is built per node per request, and frozen dataclasses cost ~5× more to construct).

    Attributes:
        node: node name.
        tier: where the wanted version is on this node (``COLD`` for base-model requests or when absent).
        gpu_slots: the engine's ``max_loras``.
        gpu_used: GPU slots holding an adapter (distinct adapters, counted once: llm-d/llm-d-router#2625).
        running: ``vllm:num_requests_running`` (requests).
        waiting: ``vllm:num_requests_waiting`` (requests).
        kv_cache_usage_perc: ``vllm:kv_cache_usage_perc``, 0..1.
        in_placement: the node is in the version's replica set.
        hrw: the HRW weight of (version, node) (``inference.policy.hrw.hrw_weight``), the tie-breaker.
        in_batch: the version has a request in the node's running batch now (the engine's
            ``running_lora_adapters``): a new one joins that batch without taking another of its ``max_loras``.
        batch_full: the node's running batch already holds ``gpu_slots`` other adapters, so vLLM's scheduler would
            defer a request for this version until one of them drains. False when unknown.
    """

    node: str
    tier: Tier
    gpu_slots: int
    gpu_used: int
    running: int
    waiting: int
    kv_cache_usage_perc: float
    in_placement: bool
    hrw: int
    in_batch: bool = False
    batch_full: bool = False

    @property
    def load(self) -> int:
        """Requests on the node (running + waiting)."""
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """Routing thresholds.

    Attributes:
        queue_saturated: waiting requests at which a node counts as saturated (GIE default 5).
        kv_saturated: KV-cache usage fraction at which a node counts as saturated (GIE default 0.8).
        load_bound: bounded-load factor ``c`` over the candidates' mean load (Mirrokni et al. use 1 + ε); 1.35
            here: placement already balances rates, and a bound much tighter sends requests off their resident
            nodes (more loads, worse balance); 1.35 trims the busiest node's share a little for 3 % more loads
            than 1.5 (docs/placement.md's sweep).
    """

    queue_saturated: int = 5
    kv_saturated: float = 0.8
    load_bound: float = 1.35


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where to send the request.

    Attributes:
        node: the chosen node's name.
        tier: the version's tier there when chosen (``GPU``/``CPU`` = no engine load needed).
        score: the residency score used (see the module docstring).
        saturated: every candidate was saturated: the caller should hold the request (admission) rather than send it.
    """

    node: str
    tier: Tier
    score: float
    saturated: bool


def residency_score(c: Candidate) -> float:
    """The #2792 residency score of ``c`` for an adapter request (0..1; -1 for an errored placement)."""
    score = TIER_SCORE[c.tier]
    if c.tier is not Tier.GPU and c.tier is not Tier.ERRORED and c.gpu_used < c.gpu_slots:
        score = max(score, FREE_SLOT_SCORE)
    return score


def is_saturated(c: Candidate, config: RouteConfig) -> bool:
    """True when ``c``'s queue or KV cache is at the saturation threshold."""
    return c.waiting >= config.queue_saturated or c.kv_cache_usage_perc >= config.kv_saturated


def _qualified(candidates: Sequence[Candidate], config: RouteConfig) -> tuple[list[Candidate], bool]:
    usable = [c for c in candidates if c.tier is not Tier.ERRORED] or list(candidates)
    unsaturated = [c for c in usable if not is_saturated(c, config)]
    if not unsaturated:
        return usable, True
    bound = config.load_bound * sum(c.load for c in unsaturated) / len(unsaturated) + 1
    bounded = [c for c in unsaturated if c.load <= bound]
    return bounded or unsaturated, False


def _affinity_key(c: Candidate) -> tuple[bool, bool, bool, bool, int, float, int, int]:
    # A batch with room, then the replica set, then in-engine (joining a running batch first) by load, then
    # residency score, load and HRW (the module docstring's order).
    in_engine = c.tier in IN_ENGINE
    load = c.running + c.waiting
    return (not c.batch_full, c.in_placement, in_engine, c.in_batch and in_engine, -load if in_engine else 0,
            residency_score(c), -load, c.hrw)


def route(candidates: Sequence[Candidate], *, base_model: bool = False,
          config: RouteConfig = RouteConfig()) -> RouteDecision | None:
    """Choose a node for one request.

    Args:
        candidates: the live nodes eligible for the request (right base model, ``max_lora_rank`` ≥ the version's
            ``r``), each with the version's tier there.
        base_model: the request is for the base model itself (no adapter).
        config: thresholds.

    Returns:
        The decision, or None when ``candidates`` is empty. When every candidate is saturated the least loaded one is
        returned with ``saturated=True``.
    """
    if not candidates:
        return None
    pool, saturated = _qualified(candidates, config)
    if base_model:
        def base_key(c: Candidate) -> tuple[float, int, int]:
            free = 1.0 - c.gpu_used / c.gpu_slots if c.gpu_slots else 1.0
            return (free, -c.load, c.hrw)

        best = max(pool, key=base_key)
        return RouteDecision(best.node, best.tier, base_key(best)[0], saturated)
    if saturated:
        best = max(pool, key=lambda c: (-c.load, residency_score(c), c.hrw))
    else:
        best = max(pool, key=_affinity_key)
    return RouteDecision(best.node, best.tier, residency_score(best), saturated)


def plan_candidates(holders: Sequence[Candidate], homes_missing: Sequence[Candidate],
                    homes: Collection[str]) -> list[Candidate]:
    """The affinity candidates for one adapter version under the reconciler's plan: the one rule the gateway
    (``inference.gateway.snapshot.node_choose``) and the simulator route by.

    Args:
        holders: the nodes that serve the version (in an engine, or by name from disk), each with its tier there.
        homes_missing: the plan's homes that do not serve it yet (``COLD``, or ``ERRORED`` where its load failed).
        homes: the plan's nodes for the version (empty when the plan names none).

    Returns:
        The holders, each in the placement when it is a home (all of them when there are no homes); then, while some
        node serves the version, ``homes_missing`` in the placement: the plan moved it there, and a caller that gets
        one of them from :func:`route` serves the request where the version is and warms the home behind it
        (``GatewayApp.node_for``). Empty when no node serves the version: the caller warms it where
        ``inference.policy.placement.warm_target`` says and waits.
    """
    out = [c._replace(in_placement=not homes or c.node in homes) for c in holders]
    if out:
        out += [c._replace(in_placement=True) for c in homes_missing]
    return out


ROUTING_POLICIES = ("affinity", "round_robin")


def route_round_robin(candidates: Sequence[Candidate], *, turn: int, base_model: bool = False,
                      config: RouteConfig = RouteConfig()) -> RouteDecision | None:
    """The baseline: the ``turn``-th candidate in node-name order, whatever holds the version (residency ignored).

    What a plain Kubernetes Service or a round-robin load balancer does; ``scripts/bench_fleet`` measures Quiver's
    ``route`` against it. ``turn`` is the caller's running request count (so the function stays pure).

    Returns:
        The decision, or None when ``candidates`` is empty; ``saturated`` when every candidate is saturated.
    """
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda c: c.node)
    pick = ordered[turn % len(ordered)]
    saturated = all(is_saturated(c, config) for c in ordered)
    return RouteDecision(pick.node, pick.tier, 0.0 if base_model else residency_score(pick), saturated)
