"""Resolve an OpenAI ``model`` to a target (base model or a ready adapter version) and pick a node for it.

Node choice is ``inference.fleet.routing.route`` over the live nodes that hold the version (``hot`` = GPU slot,
``warm`` = CPU cache, ``staged`` but still served by name = disk), fed from the nodes' last heartbeats: residency
first, never a saturated node while another qualifies, bounded load, ties by HRW rank (its docstring has the rules and
sources). Base-model requests go where the fewest GPU LoRA slots are busy.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.selectors import adapter_get, adapter_version_latest_ready
from inference.fleet.hrw import hrw_weight
from inference.fleet.routing import Candidate, route
from inference.fleet.tiers import FROM_DB_WORD, Tier
from inference.gateway.errors import GatewayError
from inference.gateway.models import Node, Placement
from inference.gateway.placement import RESIDENT, node_select_for_warm, nodes_live, placement_request_warm
from tenants.models import Tenant


@dataclass(frozen=True)
class Target:
    """What a request runs on: ``version`` None means the base model itself."""

    requested: str
    base_model: BaseModel
    version: AdapterVersion | None

    @property
    def served_name(self) -> str:
        """vLLM ``model`` to send: the version's ``lora_name`` or the base model's name."""
        return self.version.served_name if self.version else self.base_model.base_model_name


def target_resolve(tenant: Tenant, *, model: str) -> Target:
    """Map the request's ``model`` to the base model or the tenant's newest ready version.

    Raises:
        GatewayError: 404 ``model_not_found`` (unknown or another tenant's), 409 ``adapter_not_ready``.
    """
    base = BaseModel.objects.filter(base_model_name=model).first()
    if base is not None:
        return Target(requested=model, base_model=base, version=None)
    adapter = adapter_get(tenant, name=model)
    if adapter is None:
        raise GatewayError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")
    version = adapter_version_latest_ready(adapter)
    if version is None:
        raise GatewayError(
            409, f"Adapter `{model}` has no ready version yet; wait for validation or check its report.",
            code="adapter_not_ready", param="model",
        )
    return Target(requested=model, base_model=adapter.base_model, version=version)


def _candidate(node: Node, tier: Tier, version_id: int | str) -> Candidate:
    residency = node.state.get("residency") if isinstance(node.state, dict) else None
    gpu_used = residency.get("gpu", 0) if isinstance(residency, dict) else 0
    return Candidate(node=node.name, tier=tier, gpu_slots=node.max_loras, gpu_used=int(gpu_used or 0),
                     running=node.num_requests_running or 0, waiting=node.num_requests_waiting or 0,
                     kv_cache_usage_perc=node.kv_cache_usage_perc or 0.0, in_placement=True,
                     hrw=hrw_weight(version_id, node.name))


def node_for(target: Target) -> Node | None:
    """A live node that can serve ``target`` now, or None (for an adapter: none holds it resident)."""
    live = nodes_live(target.base_model)
    if target.version is None:
        nodes = {n.name: n for n in live}
        decision = route([_candidate(n, Tier.COLD, "base") for n in nodes.values()], base_model=True)
        return nodes[decision.node] if decision else None
    placements = (
        Placement.objects.select_related("node")
        .filter(Q(tier__in=RESIDENT) | Q(served=True), adapter_version=target.version, node__in=live)
    )
    by_name = {p.node.name: p.node for p in placements}
    candidates = [_candidate(p.node, FROM_DB_WORD.get(p.tier, Tier.DISK) if p.tier in RESIDENT else Tier.DISK,
                             target.version.pk) for p in placements]
    decision = route(candidates)
    return by_name[decision.node] if decision else None


def warm_request(target: Target) -> Placement | None:
    """Ask a worker to warm ``target``'s version on the best live node; None when no live node serves its base model.

    A previously ``errored`` placement is retried: each new request gets one fresh attempt.
    """
    assert target.version is not None
    node = node_select_for_warm(target.base_model, r=target.version.r)
    return placement_request_warm(target.version, node=node) if node else None
