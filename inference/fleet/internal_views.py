"""Node-facing routes (``/internal/v1/*``), served only on the internal listener (``config.internal_asgi``).

Authenticated with each node's own heartbeat token, never a tenant key (``inference.fleet.nodes``).
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from adapters_app.models import AdapterVersion
from inference.fleet.nodes import NodeRefused, node_heartbeat_accept
from inference.fleet.plan import plan_all
from inference.fleet.reconcile import tenants_at_gpu_quota
from tenants.authentication import bearer_token


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    """``POST /internal/v1/nodes/heartbeat``: a node agent's ``/v1/state`` JSON; answers ``{"node", "healthy",
    "elsewhere", "over_quota"}``.

    ``over_quota``: the ``lora_int_id`` of each adapter the node reports whose tenant is at or over its residency
    quota (``TenantResidencyQuota.max_gpu_bytes``, ``inference.fleet.reconcile.tenants_at_gpu_quota``). The node
    evicts those first when it must make room (``inference.policy.node_eviction``), so a tenant over its quota loses
    its own adapters before anyone else does, where the eviction happens.

    ``elsewhere``: the ``lora_int_id`` of each adapter the node reports that the reconciler's last plan
    (``inference.fleet.plan``) places on other nodes only. The agent ranks those below the ones planned for
    it when it must evict (``NodeAgent.note_plan``): without it, a copy left by spill-over or a re-plan held a slot on
    a node the router no longer sends that adapter to (bench_fleet: one node did 2.5x the other's loads).

    Errors are ``{"detail", "code"}``: 401 ``invalid_node_token``, 400 ``invalid``/``invalid_json``, 403
    ``node_identity_mismatch``, 409 ``node_urls_changed``/``base_model_mismatch``; a refused heartbeat changes nothing.
    """
    token = bearer_token(request.headers.get("Authorization", "")) or ""
    parsed: list[Any] = []

    def body() -> Any:
        # Parsed only once the token and the heartbeat floor pass: a 4 MB body under a bogus token (or within the
        # floor) cost the internal listener over a second of JSON parsing before its 401/429 (attack round).
        try:
            parsed.append(json.loads(request.body))
        except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's depth
            parsed.append(None)  # refused as 400
        return parsed[0]

    try:
        node = node_heartbeat_accept(token=token, body=body)
    except NodeRefused as exc:
        return JsonResponse({"detail": exc.detail, "code": exc.code}, status=exc.status)
    adapters = parsed[0].get("adapters", [])
    return JsonResponse({"node": node.name, "healthy": node.healthy,
                         "elsewhere": planned_elsewhere(node.name, adapters),
                         "over_quota": over_quota(adapters)})


def over_quota(adapters: list[dict[str, Any]]) -> list[int]:
    """The ``lora_int_id`` of the entries in ``adapters`` (a validated heartbeat's list) whose tenant's GPU-resident
    bytes reach its ``max_gpu_bytes`` quota, sorted; ``[]`` when no tenant is there."""
    tenants = tenants_at_gpu_quota()
    if not tenants:
        return []
    ids = {entry["lora_int_id"] for entry in adapters}
    return sorted(AdapterVersion.objects.filter(pk__in=ids, adapter__tenant_id__in=tenants)
                  .values_list("pk", flat=True))


def planned_elsewhere(node_name: str, adapters: list[dict[str, Any]]) -> list[int]:
    """The ``lora_int_id`` of the entries in ``adapters`` (a validated heartbeat's list) that the last plan puts on
    at least one node and not on ``node_name``; ``[]`` without a plan (Redis away: the agent then ranks by policy
    alone)."""
    plan = plan_all()
    out = []
    for entry in adapters:
        nodes = plan.get(entry["lora_int_id"])
        if nodes and node_name not in nodes:
            out.append(entry["lora_int_id"])
    return out
