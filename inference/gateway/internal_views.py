"""Node-facing routes (``/internal/v1/*``), authenticated with the shared node key, never a tenant key."""

from __future__ import annotations

import hmac
import json

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from inference.gateway.placement import node_heartbeat
from tenants.authentication import bearer_token


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    """``POST /internal/v1/nodes/heartbeat``: a node agent's ``/v1/state`` JSON; answers ``{"node", "healthy"}``."""
    token = bearer_token(request.headers.get("Authorization", "")) or ""
    if not hmac.compare_digest(token.encode(), settings.QUIVER_NODE_KEY.encode()):
        return JsonResponse({"detail": "Invalid node key.", "code": "invalid_node_key"}, status=401)
    try:
        state = json.loads(request.body)
        name = state["node"]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "Body must be the agent's state JSON with a 'node' field.", "code": "invalid"},
                            status=400)
    node = node_heartbeat(state=state)
    return JsonResponse({"node": name, "healthy": node.healthy})
