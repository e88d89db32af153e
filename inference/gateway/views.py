"""OpenAI-compatible endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``.

Async views (served by uvicorn): authenticate the tenant key, resolve ``model``, find a node holding the version
(cold → warm it through a worker, waiting at most ``QUIVER_WARM_WAIT_S``), proxy to vLLM with the served name,
stream SSE through, meter usage per adapter version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from adapters_app.models import BaseModel
from adapters_app.selectors import adapter_list_servable
from inference.gateway import proxy
from inference.gateway.errors import GatewayError
from inference.gateway.metering import usage_record_create
from inference.gateway.models import Node, Placement
from inference.gateway.node_client import node_key
from inference.gateway.routing import Target, node_for, target_resolve, warm_request
from tenants.authentication import bearer_token
from tenants.models import ApiKey, Tenant
from tenants.scopes import INFERENCE
from tenants.services import ApiKeyInvalid, api_key_verify

logger = logging.getLogger(__name__)
POLL_S = 0.2


async def _authenticate(request: HttpRequest) -> ApiKey:
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <api key>'.", code="invalid_api_key",
                           type_="authentication_error")
    try:
        key = await sync_to_async(api_key_verify)(token)
    except ApiKeyInvalid as exc:
        raise GatewayError(401, "Invalid, revoked or expired API key.", code="invalid_api_key",
                           type_="authentication_error") from exc
    if INFERENCE not in key.scopes:
        raise GatewayError(403, "This API key lacks the 'inference' scope.", code="insufficient_scope",
                           type_="permission_error")
    return key


def _placement_error(target: Target) -> str | None:
    """The code of the latest failed warm of ``target`` (e.g. ``s3_object_missing``), or None.

    Only the code reaches tenants; the detail (S3 keys, node paths) stays in ``Placement.last_error`` for operators.
    """
    placement = (
        Placement.objects.filter(adapter_version=target.version, tier=Placement.Tier.ERRORED, warming_since=None)
        .order_by("-updated_at").first()
    )
    return placement.last_error.split(":", 1)[0] if placement else None


async def _node_for(target: Target) -> Node:
    """A node ready to serve ``target``, warming a cold adapter with a bounded wait.

    Raises:
        GatewayError: 503 ``no_capacity`` (no live node), ``adapter_load_failed`` or ``adapter_warm_timeout``.
    """
    node = await sync_to_async(node_for)(target)
    if node is not None:
        return node
    if target.version is None or await sync_to_async(warm_request)(target) is None:
        raise GatewayError(503, f"No live node serves base model `{target.base_model.base_model_name}`.",
                           code="no_capacity", type_="server_error")
    deadline = time.monotonic() + settings.QUIVER_WARM_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        node = await sync_to_async(node_for)(target)
        if node is not None:
            return node
        error = await sync_to_async(_placement_error)(target)
        if error:
            raise GatewayError(503, f"Loading adapter `{target.requested}` onto a node failed ({error}); "
                               "retry, and contact the operator if it persists.",
                               code="adapter_load_failed", type_="server_error")
    raise GatewayError(503, f"Adapter `{target.requested}` is still loading; retry shortly.",
                       code="adapter_warm_timeout", type_="server_error")


def _parse_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError as exc:
        raise GatewayError(400, "Request body must be JSON.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise GatewayError(400, "Request body must be a JSON object.", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise GatewayError(400, "Field 'model' is required: your adapter's name or the base model.",
                           code="missing_model", param="model")
    return body


async def _proxy(request: HttpRequest, endpoint: str) -> HttpResponseBase:
    started = time.monotonic()
    try:
        if request.method != "POST":
            raise GatewayError(405, "Use POST.", code="method_not_allowed")
        key = await _authenticate(request)
        body = _parse_body(request)
        target = await sync_to_async(target_resolve)(key.tenant, model=body["model"])
        node = await _node_for(target)
    except GatewayError as exc:
        return exc.response()

    stream = bool(body.get("stream"))
    keep_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    upstream_body = {**body, "model": target.served_name}
    if stream:
        upstream_body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}

    async def record(status_code: int, usage: dict[str, Any] | None) -> None:
        await sync_to_async(usage_record_create)(
            api_key=key, target=target, node=node, endpoint=endpoint, stream=stream, status_code=status_code,
            usage=usage, latency_ms=(time.monotonic() - started) * 1000,
        )

    try:
        client, upstream = await proxy.open_upstream(node.engine_url, endpoint, upstream_body, node_key=node_key(node))
    except httpx.HTTPError as exc:
        logger.warning("gateway.upstream_unreachable", extra={"node": node.name, "error": str(exc)})
        await record(502, None)
        return GatewayError(502, "The inference node did not answer; retry.", code="upstream_unreachable",
                            type_="server_error").response()

    if upstream.status_code >= 400 or not stream:
        try:
            raw = await upstream.aread()
        except httpx.HTTPError as exc:
            logger.warning("gateway.upstream_failed", extra={"node": node.name, "error": str(exc)})
            await record(504, None)
            return GatewayError(504, "The inference node stopped answering; retry.", code="upstream_timeout",
                                type_="server_error").response()
        finally:
            await upstream.aclose()
            await client.aclose()
        text = proxy.rename_model(raw.decode("utf-8", "replace"), target.served_name, target.requested)
        try:
            data = json.loads(text)
        except ValueError:
            data = {"error": {"message": text[:1000], "type": "server_error", "param": None, "code": "upstream_error"}}
        if isinstance(data, dict) and upstream.status_code < 400:
            data["model"] = target.requested
        await record(upstream.status_code, data.get("usage") if isinstance(data, dict) else None)
        return JsonResponse(data, status=upstream.status_code, safe=False)

    async def done(usage: dict[str, Any] | None) -> None:
        await record(upstream.status_code, usage)

    events = proxy.relay_sse(client, upstream, served=target.served_name, requested=target.requested,
                             keep_usage=keep_usage, on_done=done)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponseBase:
    """``POST /v1/completions`` (OpenAI Completions API), streaming or not."""
    return await _proxy(request, "completions")


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    """``POST /v1/chat/completions`` (OpenAI Chat Completions API), streaming or not."""
    return await _proxy(request, "chat/completions")


def _models_payload(tenant: Tenant) -> list[dict[str, Any]]:
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
    return data


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponseBase:
    """``GET /v1/models``: the base models and the caller's adapters that have a ready version."""
    try:
        key = await _authenticate(request)
    except GatewayError as exc:
        return exc.response()
    data = await sync_to_async(_models_payload)(key.tenant)
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
async def model_detail(request: HttpRequest, model_id: str) -> HttpResponseBase:
    """``GET /v1/models/{id}``: one entry of :func:`models`, or OpenAI's 404."""
    try:
        key = await _authenticate(request)
    except GatewayError as exc:
        return exc.response()
    data = await sync_to_async(_models_payload)(key.tenant)
    for entry in data:
        if entry["id"] == model_id:
            return JsonResponse(entry)
    return GatewayError(404, f"The model `{model_id}` does not exist.", code="model_not_found",
                        param="model").response()
