"""The Django side of ``/v1/*``: ``GET /v1/models``, ``GET /v1/models/{id}``, and OpenAI-shaped 404/405 for every
other ``/v1/`` path; and the gateway's Prometheus ``/metrics`` on the internal listener. The completion routes are
served by the lean app in ``inference.gateway.app``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.selectors import adapter_list_servable
from common import auth_hints
from inference.gateway import metrics as gateway_metrics
from inference.gateway.directory import db_call
from inference.gateway.errors import GatewayError
from tenants.authentication import bearer_token
from tenants.models import ApiKey, Tenant
from tenants.scopes import INFERENCE
from tenants.services import ApiKeyInvalid, api_key_verify

logger = logging.getLogger(__name__)
POLL_S = 0.2


async def _authenticate(request: HttpRequest) -> ApiKey:
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        raise GatewayError(401, auth_hints.missing_key(), code="invalid_api_key",
                           type_="authentication_error")
    try:
        key = await db_call(api_key_verify, token)
    except ApiKeyInvalid as exc:
        raise GatewayError(401, auth_hints.invalid_key(), code="invalid_api_key",
                           type_="authentication_error") from exc
    if INFERENCE not in key.scopes:
        raise GatewayError(403, "This API key lacks the 'inference' scope.", code="insufficient_scope",
                           type_="permission_error")
    return key


def _may_call(key: ApiKey, model: str) -> bool:
    scoped = {str(a) for a in (key.adapters or [])}
    name, at, _ = model.partition("@")
    return not scoped or model in scoped or (bool(at) and name in scoped)


def _models_payload(key: ApiKey) -> list[dict[str, Any]]:
    """The models ``key`` may call: the base models and the tenant's adapters that have a ready version, by name
    only. ``name@N`` is addressable (``GET /v1/models/name@N``, and as ``model``) but not listed: the list is what an
    application should call, and pinning a version is a deliberate act (docs/versions.md)."""
    tenant: Tenant = key.tenant
    data = [
        {"id": b.base_model_name, "object": "model", "created": int(b.created_at.timestamp()), "owned_by": "quiver",
         "parent": None}
        for b in BaseModel.objects.order_by("base_model_name")
    ]
    data += [
        {"id": a.name, "object": "model", "created": int(a.created_at.timestamp()), "owned_by": tenant.slug,
         "parent": a.base_model.base_model_name}
        for a in adapter_list_servable(tenant)
    ]
    return [entry for entry in data if _may_call(key, str(entry["id"]))]


def _version_entry(key: ApiKey, model_id: str) -> dict[str, Any] | None:
    """``GET /v1/models/name@N``'s entry while version N is ready and the key may call it, else None."""
    name, at, number = model_id.partition("@")
    if not at or not number.isascii() or not number.isdigit() or len(number) > 9 or not _may_call(key, model_id):
        return None
    version = AdapterVersion.objects.select_related("adapter__base_model").filter(
        adapter__tenant=key.tenant, adapter__name=name, number=int(number), status=AdapterVersion.Status.READY).first()
    if version is None:
        return None
    return {"id": model_id, "object": "model", "created": int(version.created_at.timestamp()),
            "owned_by": key.tenant.slug, "parent": version.adapter.base_model.base_model_name}


def _get_only(request: HttpRequest) -> None:
    if request.method not in ("GET", "HEAD"):
        raise GatewayError(405, f"Use GET for {request.path}.", code="method_not_allowed", headers={"Allow": "GET"})


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponseBase:
    """``GET /v1/models``: the base models and the caller's adapters that have a ready version (those its key may
    call)."""
    try:
        _get_only(request)
        key = await _authenticate(request)
        data = await db_call(_models_payload, key)
    except GatewayError as exc:
        return exc.response()
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
async def model_detail(request: HttpRequest, model_id: str) -> HttpResponseBase:
    """``GET /v1/models/{id}``: one entry of :func:`models`, or ``name@N`` of a ready version; else OpenAI's 404."""
    try:
        _get_only(request)
        key = await _authenticate(request)
        data = await db_call(_models_payload, key)
        if "@" in model_id:
            data = [entry for entry in [await db_call(_version_entry, key, model_id)] if entry is not None]
    except GatewayError as exc:
        return exc.response()
    for entry in data:
        if entry["id"] == model_id:
            return JsonResponse(entry)
    return GatewayError(404, f"The model `{model_id}` does not exist. GET /v1/models lists the models this key can call.", code="model_not_found",
                        param="model").response()


@csrf_exempt
def unknown_route(request: HttpRequest, rest: str = "") -> HttpResponseBase:
    """Any other ``/v1/`` path: OpenAI's JSON 404 (never Django's HTML page)."""
    return GatewayError(404, f"Unknown route {request.path}; see the OpenAI API reference for the paths served.",
                        code="not_found").response()


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the gateway's Prometheus figures (``inference.gateway.metrics``); internal listener only."""
    body, content_type = gateway_metrics.render()
    return HttpResponse(body, content_type=content_type)
