"""Frozen views the gateway's fast path works from, and the one node-choice function.

The fast path never touches the ORM: caches (``inference.gateway.directory``) hold these views, filled from the
database off the request path. Node choice is a pure function over a :class:`FleetView` (conventions "Decisions are
pure"); it is the single call a fleet routing policy replaces.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime

from inference.policy.hrw import hrw_weight
from inference.policy.routing import (
    Candidate,
    RouteConfig,
    RouteDecision,
    plan_candidates,
    route,
    route_round_robin,
)
from inference.policy.tiers import FROM_DB_WORD, Tier
from inference.policy.versions import choose_version

RESIDENT_TIERS = frozenset({"warm", "hot"})


@dataclass(frozen=True)
class Limits:
    """Per-tenant or per-key limits; None = unlimited. Units: requests/min, tokens/min, concurrent requests, tokens."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class KeyView:
    """An API key as the gateway needs it: digest to check the secret, tenant, scopes, expiry and limits."""

    pk: int
    key_id: str
    digest: str
    enabled: bool
    expires_at: datetime | None
    scopes: frozenset[str]
    tenant_id: int
    tenant_slug: str
    tenant_limits: Limits = Limits()
    key_limits: Limits = Limits()
    priority: int = 0  # vLLM's priority for this key's requests (lower first): tenants.models.PRIORITY_CLASSES
    # The models this key may call (adapter names, or ``name@N``); empty = every model of its tenant.
    adapters: frozenset[str] = frozenset()

    def may_call(self, model: str) -> bool:
        """Whether this key may call ``model``: any model when unscoped; else an adapter it names (every version,
        ``name`` and ``name@N``) or a version it names (``name@N`` only). A base model only when named."""
        if not self.adapters:
            return True
        if model in self.adapters:
            return True
        name, at, _ = model.partition("@")
        return bool(at) and name in self.adapters

    def not_found_message(self, model: str) -> str:
        """The 404 text for a ``model`` this key cannot call (``model`` already clipped for echo). One answer for an
        unknown model, another tenant's and one outside the key's scope; a scoped key is told its own scope (which
        it holds anyway), never that base models are callable, since they are not to it unless named."""
        if not self.adapters:
            return (f"The model `{model}` does not exist. GET /v1/models lists the models this key can call: your "
                    "adapters' names and the base models.")
        names = ", ".join(f"`{name}`" for name in sorted(self.adapters))
        return (f"The model `{model}` does not exist or is outside this key's scope. This key can call only {names} "
                "(an adapter name also reaches its versions as `name@N`); GET /v1/models lists them. Call one of "
                "those, or use a key without an adapter list.")

    def secret_matches(self, secret: str, hmac_key: bytes) -> bool:
        """Constant-time check of the presented secret against the stored HMAC-SHA256 digest (conventions §4)."""
        digest = hmac.new(hmac_key, secret.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.digest, digest)


@dataclass(frozen=True)
class TargetView:
    """What a request runs on. ``version_id`` None means the base model itself.

    ``served_name`` is vLLM's ``model`` (the version's ``lora_name`` or the base model's name).
    """

    requested: str
    base_model_id: int
    base_model_name: str
    served_name: str
    version_id: int | None = None
    version_number: int | None = None
    r: int | None = None
    adapter_id: int | None = None
    adapter_limits: Limits = Limits()  # the adapter's own RPM/TPM limits (tenants' and keys' apply beside them)


@dataclass(frozen=True)
class RuleView:
    """What ``model`` reaches: one target (a base model, ``name@N``, or a rule of one version) or a weighted split
    of an adapter's versions (``weights`` in whole percentages, parallel to ``targets``; ``salt`` keeps
    stickiness per adapter)."""

    targets: tuple[TargetView, ...]
    weights: tuple[int, ...] = (100,)
    salt: str = ""

    def pick(self, *, user: str | None, draw: float) -> TargetView:
        """The target for one request: :func:`inference.policy.versions.choose_version` (sticky per OpenAI
        ``user``, else by the caller's uniform ``draw`` in [0, 1))."""
        if len(self.targets) == 1:
            return self.targets[0]
        return self.targets[choose_version(self.weights, salt=self.salt, user=user, draw=draw)]


@dataclass(frozen=True)
class NodeView:
    """A live node: where to send requests (``engine_url`` with bearer ``key``, the node's own derived key), and the
    gauges last reported by its heartbeat."""

    pk: int
    name: str
    engine_url: str
    base_model_id: int | None
    key: str = field(default="", repr=False)
    max_lora_rank: int = 0
    max_loras: int = 0
    gpu_used: int = 0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage_perc: float = 0.0
    running_loras: frozenset[str] | None = None  # served names in the engine's batch now; None = unknown


@dataclass(frozen=True)
class PlacementView:
    """Residency of one version on one node (``tier`` in the database's words; ``served``: the engine answers for
    the name; ``error_code``: the code of a finished failed warm, else empty)."""

    node_id: int
    version_id: int
    tier: str
    served: bool
    error_code: str = ""


@dataclass(frozen=True)
class FleetView:
    """Every live node and the placements on them, as read at ``read_at`` (monotonic seconds)."""

    nodes: tuple[NodeView, ...] = ()
    placements: dict[int, tuple[PlacementView, ...]] = field(default_factory=dict)
    read_at: float = 0.0
    homes: dict[int, tuple[str, ...]] = field(default_factory=dict)  # version → its nodes in the reconciler's plan

    def nodes_for_base(self, base_model_id: int) -> list[NodeView]:
        """Live nodes serving ``base_model_id``."""
        return [n for n in self.nodes if n.base_model_id == base_model_id]

    def serves(self, node_id: int, version_id: int) -> bool:
        """True when node ``node_id`` holds ``version_id`` in its engine or still serves its name (what
        ``node_choose`` counts as a candidate for the affinity policy)."""
        return any(p.node_id == node_id and (p.tier in RESIDENT_TIERS or p.served)
                   for p in self.placements.get(version_id, ()))

    def warm_error(self, version_id: int) -> str:
        """The error code of the latest finished failed warm of ``version_id`` on a live node, else empty."""
        return next((p.error_code for p in self.placements.get(version_id, ()) if p.error_code), "")


DEFAULT_ROUTE_CONFIG = RouteConfig()


def _candidate(node: NodeView, tier: Tier, version_id: int | str, served_name: str | None = None) -> Candidate:
    batch = node.running_loras
    in_batch = batch is not None and served_name is not None and served_name in batch
    # Room for one more adapter in the running batch: vLLM defers the request otherwise (inference.policy.routing).
    full = (batch is not None and served_name is not None and not in_batch and node.max_loras > 0
            and len(batch) >= node.max_loras and tier is not Tier.ERRORED)
    return Candidate(node=node.name, tier=tier, gpu_slots=node.max_loras, gpu_used=node.gpu_used,
                     running=node.num_requests_running, waiting=node.num_requests_waiting,
                     kv_cache_usage_perc=node.kv_cache_usage_perc, in_placement=True,
                     hrw=hrw_weight(version_id, node.name), in_batch=in_batch, batch_full=full)


def node_choose(fleet: FleetView, target: TargetView, *, policy: str = "affinity", turn: int = 0,
                config: RouteConfig = DEFAULT_ROUTE_CONFIG) -> NodeView | None:
    """The node to send ``target`` to now, or None (no live node; for an adapter: none serves it yet).

    ``inference.policy.routing.route`` over the live nodes that hold the version (``hot`` = GPU slot, ``warm`` = CPU
    cache, ``staged`` but still served by name = disk), fed from the nodes' last heartbeats: residency first, never a
    saturated node while another qualifies, bounded load, ties by HRW rank (its docstring has the rules and sources).
    Base-model requests go where the fewest GPU LoRA slots are busy. This is the gateway's one node-choice call.
    ``policy`` ``round_robin`` (``QUIVER_ROUTING_POLICY``, the benchmark's baseline) takes the ``turn``-th of all
    live nodes of the base model able to load the version's rank, whether or not they hold it, as a round-robin load
    balancer in front of engines that load on demand does (``inference.policy.routing.route_round_robin``); the
    gateway then warms the version there if needed (``FleetView.serves``). ``config`` carries the thresholds
    (``QUIVER_ROUTING_LOAD_BOUND`` in the gateway).
    """
    def decide(candidates: list[Candidate], base_model: bool = False) -> RouteDecision | None:
        if policy == "round_robin":
            return route_round_robin(candidates, turn=turn, base_model=base_model, config=config)
        return route(candidates, base_model=base_model, config=config)

    live = fleet.nodes_for_base(target.base_model_id)
    by_name = {n.name: n for n in live}
    if target.version_id is None:
        decision = decide([_candidate(n, Tier.COLD, "base") for n in live], base_model=True)
        return by_name[decision.node] if decision else None
    by_pk = {n.pk: n for n in live}
    if policy == "round_robin":
        tiers = {p.node_id: p.tier for p in fleet.placements.get(target.version_id, ())}
        decision = decide([_candidate(n, FROM_DB_WORD[tiers[n.pk]] if tiers.get(n.pk) in RESIDENT_TIERS
                                      else Tier.COLD, target.version_id)
                           for n in live if n.max_lora_rank >= (target.r or 0)])
        return by_name[decision.node] if decision else None
    placed = fleet.placements.get(target.version_id, ())
    held = {p.node_id: p for p in placed if p.node_id in by_pk and (p.tier in RESIDENT_TIERS or p.served)}
    errored = {p.node_id for p in placed if p.tier == "errored"}
    homes = {h for h in fleet.homes.get(target.version_id, ())
             if h in by_name and by_name[h].max_lora_rank >= (target.r or 0)}
    holders = [_candidate(by_pk[pk], FROM_DB_WORD[p.tier] if p.tier in RESIDENT_TIERS else Tier.DISK,
                          target.version_id, target.served_name) for pk, p in held.items()]
    # A home of the reconciler's plan that does not hold it yet is a candidate too (cold, in the placement): the
    # plan moved it there (bounded load by rate), and the caller warms it where this returns (plan_candidates, which
    # the simulator routes by too; route ranks the placement first, after the saturation and load filters).
    missing = [_candidate(by_name[h], Tier.ERRORED if by_name[h].pk in errored else Tier.COLD, target.version_id,
                          target.served_name) for h in sorted(homes) if by_name[h].pk not in held]
    decision = decide(plan_candidates(holders, missing, homes))
    return by_name[decision.node] if decision else None
