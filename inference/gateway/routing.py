"""Resolve an OpenAI ``model`` to a target (base model or a ready adapter version) and pick a node for it.

Node choice prefers a node where the version is ``hot`` (already batching), then ``warm``, then one that still serves
the name from disk (its engine LRU dropped the weights), then the shortest queue
(``vllm:num_requests_waiting``): LoRA affinity as in GIE/llm-d's scorer (shared/notes/anchors.md §5.6).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Case, IntegerField, Q, Value, When

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.selectors import adapter_get, adapter_version_latest_ready
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


def node_for(target: Target) -> Node | None:
    """A live node that can serve ``target`` now, or None (for an adapter: none holds it resident)."""
    live = nodes_live(target.base_model)
    if target.version is None:
        return live.order_by("num_requests_waiting", "kv_cache_usage_perc", "name").first()
    placements = (
        Placement.objects.select_related("node")
        .filter(Q(tier__in=RESIDENT) | Q(served=True), adapter_version=target.version, node__in=live)
        .annotate(rank=Case(When(tier=Placement.Tier.HOT, then=Value(0)), When(tier=Placement.Tier.WARM, then=Value(1)),
                            default=Value(2), output_field=IntegerField()))
        .order_by("rank", "node__num_requests_waiting", "node__name")
    )
    first = placements.first()
    return first.node if first else None


def warm_request(target: Target) -> Placement | None:
    """Ask a worker to warm ``target``'s version on the best live node; None when no live node serves its base model.

    A previously ``errored`` placement is retried: each new request gets one fresh attempt.
    """
    assert target.version is not None
    node = node_select_for_warm(target.base_model, r=target.version.r)
    return placement_request_warm(target.version, node=node) if node else None
