"""Node-facing routes (``/internal/v1/*``), served only on the internal listener (``config.internal_asgi``).

Authenticated with each node's own heartbeat token, never a tenant key (``inference.fleet.nodes``).
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from adapters_app.models import AdapterVersion, served_name
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
    elsewhere = planned_elsewhere(node.name, adapters)
    tenants = tenants_at_gpu_quota()
    named = named_versions(adapters, set(elsewhere) | ({e["lora_int_id"] for e in adapters} if tenants else set()))
    return JsonResponse({"node": node.name, "healthy": node.healthy,
                         "elsewhere": [pk for pk in elsewhere if pk in named],
                         "over_quota": sorted(pk for pk, tenant_id in named.items() if tenant_id in tenants)})


def named_versions(adapters: list[dict[str, Any]], wanted: set[int]) -> dict[int, int]:
    """``{lora_int_id: tenant id}`` of the entries of ``adapters`` (a validated heartbeat's list) among ``wanted``
    whose ``lora_name`` is their version's served name: the answer's hints (``over_quota``: the node evicts those
    first, so a tenant over its residency quota loses its own adapters before anyone else does; ``elsewhere``) name
    only versions the node was sent. A stolen node token listing bare version ids learned where the plan put each
    and whether its tenant was at its GPU quota (attack round). One query, none when nothing is wanted."""
    if not wanted:
        return {}
    names = {pk: (served_name(slug, name, pk), tenant_id) for pk, slug, name, tenant_id in AdapterVersion.objects
             .filter(pk__in=wanted).values_list("pk", "adapter__tenant__slug", "adapter__name", "adapter__tenant_id")}
    return {e["lora_int_id"]: names[e["lora_int_id"]][1] for e in adapters
            if e["lora_int_id"] in names and names[e["lora_int_id"]][0] == e["lora_name"]}


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
