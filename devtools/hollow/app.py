"""The emulated engine's HTTP server: vLLM's routes the agent and the gateway use, and ``inference.node.engine_ext``'s.

Served (everything but ``/health`` and ``/metrics`` needs the node key as ``Authorization: Bearer``, as
``engine_ext.QuiverEngineExtension`` enforces on a real engine):

- ``GET /health``, ``GET /metrics`` (vLLM's series: ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:num_requests_waiting_by_reason``, ``vllm:num_preemptions_total``,
  ``vllm:lora_requests_info``, ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``,
  ``vllm:request_success_total``; plus ``hollow:*`` series for the scale run);
- ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /tokenize``
  (``devtools.hollow.openai_api``);
- ``/quiver/v1/{add_lora,remove_lora,evict_lora,pin_lora,eviction_policy,eviction_hints}`` and
  ``GET /quiver/v1/loras``, with engine_ext's bodies, answers and error codes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from devtools.hollow import openai_api
from devtools.hollow.engine import HollowEngine, ServedLora
from inference.policy.eviction import AllPinnedError

EVICTION_POLICIES = ("lru", "lfu", "cost")


class ExtensionError(Exception):
    """An ``engine_ext`` error: ``{"detail", "code"}`` with ``status``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ExtensionError(400, "invalid_request", f"'{key}' must be a non-empty string")
    return value


def _served(engine: HollowEngine, name: str) -> ServedLora:
    lora = engine.served.get(name)
    if lora is None:
        raise ExtensionError(404, "lora_not_found", f"'{name}' is not loaded")
    return lora


def read_adapter(engine: HollowEngine, path: str) -> int:
    """The bytes the cost model charges for the adapter at ``path`` (from its ``adapter_config.json``).

    Raises:
        ExtensionError: 422 ``engine_load_failed`` as vLLM fails: no adapter there, or ``r`` over the rank limit.
    """
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ExtensionError(422, "engine_load_failed", f"No adapter found for {path}") from exc
    r = int(config.get("r") or 0)
    if r > engine.max_lora_rank:
        raise ExtensionError(422, "engine_load_failed",
                             f"LoRA rank {r} is greater than max_lora_rank {engine.max_lora_rank}.")
    return engine.costs.adapter_bytes(r, None if engine.charge_all_linear else config.get("target_modules"))


async def add_lora(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.add_lora``: serve ``lora_name`` as ``lora_int_id`` from ``lora_path`` (the load takes the cost
    model's disk → CPU and CPU → GPU time)."""
    name, path = _str(body, "lora_name"), _str(body, "lora_path")
    lora_id = body.get("lora_int_id")
    if not isinstance(lora_id, int) or isinstance(lora_id, bool) or lora_id < 1:
        raise ExtensionError(400, "invalid_request", "'lora_int_id' must be an integer >= 1")
    if name == engine.model:
        raise ExtensionError(409, "lora_name_is_base_model", f"'{name}' is a served base model")
    existing = engine.served.get(name)
    if existing is not None and existing.lora_int_id != lora_id:
        raise ExtensionError(409, "lora_name_conflict",
                             f"'{name}' is already served with lora_int_id {existing.lora_int_id}")
    for other in engine.served.values():
        if other.lora_int_id == lora_id and other.lora_name != name:
            raise ExtensionError(409, "lora_int_id_conflict", f"lora_int_id {lora_id} is already used by "
                                                              f"'{other.lora_name}'")
    size = read_adapter(engine, path)
    lora = ServedLora(name, lora_id, path, size)
    try:
        ms = engine.add_lora(lora)
    except AllPinnedError as exc:
        raise ExtensionError(422, "engine_load_failed", str(exc)) from exc
    engine.served[name] = lora
    if ms:
        await asyncio.sleep(ms / 1000)
    if body.get("pin"):
        _pin(engine, lora)
    return {"lora_name": name, "lora_int_id": lora_id, "lora_path": path,
            "pinned": lora_id in engine.loras.pinned, "already_loaded": existing is not None}


def _pin(engine: HollowEngine, lora: ServedLora) -> None:
    try:
        engine.add_lora(lora)
        engine.pin_lora(lora.lora_int_id)
    except AllPinnedError as exc:
        raise ExtensionError(409, "pin_failed", str(exc)) from exc


async def pin_lora(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.pin_lora``."""
    lora = _served(engine, _str(body, "lora_name"))
    _pin(engine, lora)
    return {"lora_name": lora.lora_name, "lora_int_id": lora.lora_int_id, "pinned": True}


async def remove_lora(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.remove_lora``: stop serving the name and drop it from the engine."""
    lora = _served(engine, _str(body, "lora_name"))
    del engine.served[lora.lora_name]
    engine.remove_lora(lora.lora_int_id)
    return {"lora_name": lora.lora_name, "lora_int_id": lora.lora_int_id}


async def evict_lora(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.evict_lora``: out of the engine, the name still served (reloaded on its next request)."""
    lora = _served(engine, _str(body, "lora_name"))
    engine.remove_lora(lora.lora_int_id)
    return {"lora_name": lora.lora_name, "lora_int_id": lora.lora_int_id, "tier": "disk"}


async def eviction_policy(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.eviction_policy``: the order the engine's own loads evict by from now on
    (``HollowEngine._make_room``, as the worker extension's ``quiver_set_eviction_policy``)."""
    policy = _str(body, "policy")
    if policy not in EVICTION_POLICIES:
        raise ExtensionError(400, "invalid_policy", f"policy must be one of {', '.join(EVICTION_POLICIES)}")
    engine.eviction_policy = policy
    return {"policy": policy}


async def eviction_hints(engine: HollowEngine, body: dict[str, Any]) -> dict[str, Any]:
    """``engine_ext.eviction_hints``: checked, counted, and ranked by in the engine's own loads for ``valid_s``
    seconds (the worker extension's ``quiver_set_eviction_hints``)."""
    counts, ids = {}, {}
    for key in ("over_quota", "elsewhere"):
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise ExtensionError(400, "invalid_request", f"'{key}' must be a list of at most 10,000 integers")
        counts[key], ids[key] = len(value), frozenset(value)
    valid_s = body.get("valid_s", 0)
    if not isinstance(valid_s, int | float) or isinstance(valid_s, bool) or not 0 <= valid_s <= 3600:
        raise ExtensionError(400, "invalid_request", "'valid_s' must be a number of seconds in 0..3600")
    engine.hints = (time.monotonic() + float(valid_s), ids["over_quota"], ids["elsewhere"])
    return counts


def list_loras(engine: HollowEngine) -> dict[str, Any]:
    """``engine_ext.list_loras``: served names with their tier, and the worker's residency report."""
    residency = engine.residency()
    gpu, cpu = set(engine.loras.gpu), set(engine.loras.cpu)
    loras = [{"lora_name": s.lora_name, "lora_int_id": s.lora_int_id, "lora_path": s.lora_path,
              "pinned": s.lora_int_id in engine.loras.pinned, "in_engine": s.lora_int_id in cpu,
              "tier": "gpu" if s.lora_int_id in gpu else ("cpu" if s.lora_int_id in cpu else "disk"),
              "bytes": engine.sizes.get(s.lora_int_id, 0) if s.lora_int_id in cpu else 0}
             for s in engine.served.values()]
    return {"loras": loras, "engine_lora_int_ids": sorted(cpu), "residency": residency}


_POST = {"add_lora": add_lora, "remove_lora": remove_lora, "evict_lora": evict_lora, "pin_lora": pin_lora,
         "eviction_policy": eviction_policy, "eviction_hints": eviction_hints}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(engine: HollowEngine) -> str:
    """Prometheus text with vLLM 0.32's series names and labels (docs/vllm-cpu.md §6)."""
    base = f'engine="0",model_name="{_label(engine.model)}"'
    waiting = len(engine.waiting)
    running = _label(",".join(engine.lora_names(engine.running)))
    waiting_names = _label(",".join(engine.lora_names(engine.waiting)))
    lines = [
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{base}}} {len(engine.running)}.0",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{base}}} {waiting}.0",
        "# TYPE vllm:num_requests_waiting_by_reason gauge",
        f'vllm:num_requests_waiting_by_reason{{{base},reason="capacity"}} {waiting - engine.deferred}.0',
        f'vllm:num_requests_waiting_by_reason{{{base},reason="deferred"}} {engine.deferred}.0',
        "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{base}}} {engine.kv_usage():.6f}",
        "# TYPE vllm:num_preemptions counter", f"vllm:num_preemptions_total{{{base}}} {engine.preemptions}.0",
        "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{{{base}}} {engine.prompt_tokens}.0",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{base}}} {engine.generation_tokens}.0",
        "# TYPE vllm:request_success counter", f"vllm:request_success_total{{{base}}} {engine.request_success}.0",
        "# TYPE vllm:lora_requests_info gauge",
        f'vllm:lora_requests_info{{max_lora="{engine.loras.max_loras}",running_lora_adapters="{running}",'
        f'waiting_lora_adapters="{waiting_names}"}} {time.time():.3f}',
        "# TYPE hollow:arrival_tier counter",
        *(f'hollow:arrival_tier_total{{tier="{t}"}} {n}.0' for t, n in sorted(engine.arrival_tiers.items())),
        "# TYPE hollow:busy_seconds counter", f"hollow:busy_seconds_total {engine.busy_ms / 1000:.3f}",
        "# TYPE hollow:lora_loads counter", f"hollow:lora_loads_total {sum(engine.loads.values())}.0",
    ]
    return "\n".join(lines) + "\n"


def create_app(engine: HollowEngine, api_key: str) -> Starlette:
    """The ASGI app serving ``engine`` behind ``api_key`` (the node key).

    Raises:
        ValueError: ``api_key`` is empty (a real engine refuses to start without one).
    """
    if not api_key:
        raise ValueError("the emulated engine needs the node key, as engine_ext does")
    digest = hashlib.sha256(api_key.encode()).digest()

    def authorized(request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and bool(token) and hmac.compare_digest(
            hashlib.sha256(token.encode()).digest(), digest)

    async def body_of(request: Request) -> dict[str, Any] | Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return openai_api.error_response(openai_api.RequestError(400, "request body is not JSON"))
        if not isinstance(body, dict):
            return openai_api.error_response(openai_api.RequestError(400, "request body must be a JSON object"))
        return body

    def unauthorized() -> JSONResponse:
        return JSONResponse({"error": {"message": "Unauthorized", "type": "invalid_request_error",
                                       "code": "unauthorized"}}, status_code=401)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(metrics_text(engine), media_type="text/plain; version=0.0.4")

    async def openai(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        if request.url.path == "/v1/models":
            return JSONResponse(openai_api.models(engine))
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        if request.url.path == "/tokenize":
            return openai_api.tokenize(engine, body)
        return await openai_api.completions(engine, body, chat=request.url.path == "/v1/chat/completions")

    async def quiver(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"detail": "Unauthorized", "code": "unauthorized"}, status_code=401)
        route = request.path_params["route"]
        try:
            if route == "loras" and request.method == "GET":
                return JSONResponse(list_loras(engine))
            handler = _POST.get(route)
            if handler is None:
                return JSONResponse({"detail": "Not found.", "code": "not_found"}, status_code=404)
            if request.method != "POST":
                return JSONResponse({"detail": "Method not allowed.", "code": "method_not_allowed"}, status_code=405)
            try:
                body = json.loads(await request.body() or b"{}")
            except ValueError:
                raise ExtensionError(400, "invalid_json", "request body is not JSON") from None
            if not isinstance(body, dict):
                raise ExtensionError(400, "invalid_request", "request body must be a JSON object")
            return JSONResponse(await handler(engine, body))
        except ExtensionError as exc:
            return JSONResponse({"detail": exc.detail, "code": exc.code}, status_code=exc.status)

    return Starlette(routes=[
        Route("/health", health), Route("/metrics", metrics),
        Route("/v1/models", openai), Route("/v1/completions", openai, methods=["POST"]),
        Route("/v1/chat/completions", openai, methods=["POST"]), Route("/tokenize", openai, methods=["POST"]),
        Route("/quiver/v1/{route}", quiver, methods=["GET", "POST"]),
    ])
