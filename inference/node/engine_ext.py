"""ASGI middleware adding Quiver's LoRA control routes inside vLLM's OpenAI API server.

Why it exists: vLLM 0.32's `POST /v1/load_lora_adapter` takes only `lora_name`, `lora_path`,
`load_inplace` and `is_3d_lora_weight` (`vllm/entrypoints/serve/lora/protocol.py`) and assigns
`lora_int_id` from a process-local counter (`OpenAIServingModels.load_lora_adapter` in
`vllm/entrypoints/openai/models/serving.py`). Quiver's rule is that `lora_int_id` is the control
plane's `AdapterVersion` primary key, and there is no HTTP route for `pin_lora` at all. Mounted with
`--middleware inference.node.engine_ext.QuiverEngineExtension` (`vllm/entrypoints/serve/middleware/
register.py`), this class serves, inside the API server process:

- `POST /quiver/v1/add_lora` `{"lora_name", "lora_int_id", "lora_path", "pin": false}`
- `POST /quiver/v1/remove_lora` `{"lora_name"}` (stop serving the name)
- `POST /quiver/v1/evict_lora` `{"lora_name"}` (out of the CPU cache; the name stays served, reloaded from disk)
- `POST /quiver/v1/pin_lora` `{"lora_name"}`
- `POST /quiver/v1/eviction_policy` `{"policy": "lru" | "lfu" | "cost"}` (the victim of loads into a full CPU cache)
- `POST /quiver/v1/eviction_hints` `{"over_quota": [id], "elsewhere": [id], "valid_s": s}` (the control plane's
  hints, relayed by the agent: ``inference.policy.node_eviction``)
- `POST /quiver/v1/abort` `{"request_ids": [str]}` (stop generating for requests whose client left; the gateway
  then reads the engine's stream to its end, so the tokens already generated are billed). vLLM's own
  `/inference/v1/abort_requests` is mounted only with `--enable-scale-out`, answers before the abort took effect (a
  background task) and checks nothing; this one has aborted when it answers.
- `GET  /quiver/v1/loras`

It calls `app.state.engine_client` (`add_lora`, `remove_lora`, `pin_lora`, `list_loras`) and records
the adapter in `app.state.openai_serving_models.lora_requests`, the table that `model=<lora_name>`
requests and `/v1/models` read. Errors are `{"detail": str, "code": str}`.

Auth: user middleware is added after vLLM's `AuthenticationMiddleware`, so it runs *before* it, and
`/quiver` is outside vLLM's guarded prefixes anyway; this class therefore checks the bearer token
itself against `VLLM_API_KEY` (set by `inference.node.launch`). Without a key the engine refuses to start
(lifespan startup fails), since an open engine would let anyone load adapters and read every prompt.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from vllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)

PREFIX = "/quiver/v1/"
MAX_BODY_BYTES = 1024 * 1024
# How often a route waiting on the engine checks that the engine is still alive (_unless_engine_dead).
ENGINE_ALIVE_POLL_S = 1.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ExtensionError(Exception):
    """A handled failure, rendered as `{"detail", "code"}` with `status`."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def _pinned(state: Any) -> set[int]:
    pinned = getattr(state, "quiver_pinned_lora_ids", None)
    if pinned is None:
        pinned = set()
        state.quiver_pinned_lora_ids = pinned
    return pinned


def _require_str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ExtensionError(400, "invalid_request", f"'{key}' must be a non-empty string")
    return value


def _require_id(body: dict[str, Any]) -> int:
    value = body.get("lora_int_id")
    # bool is an int subclass; vLLM requires ids >= 1 (`LoRARequest.__post_init__`).
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ExtensionError(400, "invalid_request", "'lora_int_id' must be an integer >= 1")
    return value


async def add_lora(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Load an adapter into the engine under a caller-chosen `lora_int_id` and serve it by name.

    Args:
        state: the API server's `app.state` (needs `engine_client`, `openai_serving_models`).
        body: `{"lora_name": str, "lora_int_id": int >= 1, "lora_path": str, "pin": bool = False}`.

    Returns:
        `{"lora_name", "lora_int_id", "lora_path", "pinned", "already_loaded"}`. Loading the same
        name with the same id again is idempotent (re-adds to the engine's CPU cache if evicted).

    Raises:
        ExtensionError: 400 `invalid_request`; 409 `lora_name_conflict` (name served with another
            id, or equal to the base model's name), `lora_int_id_conflict` (id used by another
            name); 422 `engine_load_failed` when the engine rejects the adapter; 409 `pin_failed`.
    """
    lora_name = _require_str(body, "lora_name")
    lora_path = _require_str(body, "lora_path")
    lora_int_id = _require_id(body)
    pin = bool(body.get("pin", False))
    models = state.openai_serving_models
    engine = state.engine_client
    if models.is_base_model(lora_name):
        raise ExtensionError(409, "lora_name_is_base_model", f"'{lora_name}' is a served base model")

    async with models.lora_resolver_lock[lora_name]:
        existing = models.lora_requests.get(lora_name)
        if existing is not None and existing.lora_int_id != lora_int_id:
            raise ExtensionError(
                409,
                "lora_name_conflict",
                f"'{lora_name}' is already served with lora_int_id {existing.lora_int_id}",
            )
        for other in models.lora_requests.values():
            if other.lora_int_id == lora_int_id and other.lora_name != lora_name:
                raise ExtensionError(
                    409,
                    "lora_int_id_conflict",
                    f"lora_int_id {lora_int_id} is already used by '{other.lora_name}'",
                )
        request = LoRARequest(lora_name=lora_name, lora_int_id=lora_int_id, lora_path=lora_path)
        try:
            # Already in the CPU cache -> the engine returns False; both mean "resident now".
            await engine.add_lora(request)
        except Exception as exc:  # the engine raises plain exceptions for bad adapters
            logger.warning(
                "engine_ext.add_lora_failed",
                extra={"lora_name": lora_name, "lora_int_id": lora_int_id, "error": str(exc)},
            )
            raise ExtensionError(422, "engine_load_failed", str(exc)) from exc
        models.lora_requests[lora_name] = request
        if pin:
            await _pin(state, lora_name, lora_int_id)
    logger.info(
        "engine_ext.add_lora",
        extra={"lora_name": lora_name, "lora_int_id": lora_int_id, "already_loaded": existing is not None},
    )
    return {
        "lora_name": lora_name,
        "lora_int_id": lora_int_id,
        "lora_path": lora_path,
        "pinned": lora_int_id in _pinned(state),
        "already_loaded": existing is not None,
    }


def _served(models: Any, lora_name: str) -> Any:
    """The `LoRARequest` served as `lora_name`; raises ExtensionError 404 `lora_not_found` when none is."""
    existing = models.lora_requests.get(lora_name)
    if existing is None:
        raise ExtensionError(404, "lora_not_found", f"'{lora_name}' is not loaded")
    return existing


async def _pin(state: Any, lora_name: str, lora_int_id: int) -> None:
    try:
        ok = await state.engine_client.pin_lora(lora_int_id)
    except Exception as exc:  # e.g. every CPU slot already pinned
        raise ExtensionError(409, "pin_failed", str(exc)) from exc
    if not ok:
        raise ExtensionError(409, "pin_failed", f"engine refused to pin '{lora_name}'")
    _pinned(state).add(lora_int_id)


async def pin_lora(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Pin a served adapter in the engine's CPU cache so LRU never evicts it (`pin_lora`).

    Args:
        state: the API server's `app.state`.
        body: `{"lora_name": str}`.

    Returns:
        `{"lora_name", "lora_int_id", "pinned": True}`.

    Raises:
        ExtensionError: 404 `lora_not_found`; 409 `pin_failed`.
    """
    lora_name = _require_str(body, "lora_name")
    models = state.openai_serving_models
    async with models.lora_resolver_lock[lora_name]:
        existing = _served(models, lora_name)
        # pin_lora only works on an adapter in the CPU cache; re-add in case LRU evicted it.
        await state.engine_client.add_lora(existing)
        await _pin(state, lora_name, existing.lora_int_id)
    return {"lora_name": lora_name, "lora_int_id": existing.lora_int_id, "pinned": True}


async def remove_lora(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Stop serving an adapter and drop it from the engine (`remove_lora`).

    Unlike the stock `/v1/unload_lora_adapter`, which only forgets the name, this also frees the
    engine's CPU-cache slot.

    Args:
        state: the API server's `app.state`.
        body: `{"lora_name": str}`.

    Returns:
        `{"lora_name", "lora_int_id"}`.

    Raises:
        ExtensionError: 404 `lora_not_found`.
    """
    lora_name = _require_str(body, "lora_name")
    models = state.openai_serving_models
    async with models.lora_resolver_lock[lora_name]:
        existing = models.lora_requests.pop(lora_name, None)
        if existing is None:
            raise ExtensionError(404, "lora_not_found", f"'{lora_name}' is not loaded")
        _pinned(state).discard(existing.lora_int_id)
        await state.engine_client.remove_lora(existing.lora_int_id)
    logger.info("engine_ext.remove_lora", extra={"lora_name": lora_name, "lora_int_id": existing.lora_int_id})
    return {"lora_name": lora_name, "lora_int_id": existing.lora_int_id}


async def evict_lora(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Drop a served adapter from the engine's CPU cache (and GPU slot) but keep serving its name.

    The engine's own LRU does the same (``LRUCacheWorkerLoRAManager.add_adapter`` in ``vllm/lora/worker_manager.py``):
    the name stays in ``lora_requests``, so its next request reloads it from ``lora_path`` (tier ``disk``) instead of
    answering 404. The agent evicts this way to make room, so a gateway routing on a view up to a heartbeat old
    never meets a 404 for an eviction (bench_fleet: 6 to 18 such 404s per run, each a re-route and a warm wait).

    Args:
        state: the API server's `app.state`.
        body: `{"lora_name": str}`.

    Returns:
        `{"lora_name", "lora_int_id", "tier": "disk"}`.

    Raises:
        ExtensionError: 404 `lora_not_found`.
    """
    lora_name = _require_str(body, "lora_name")
    models = state.openai_serving_models
    async with models.lora_resolver_lock[lora_name]:
        existing = _served(models, lora_name)
        _pinned(state).discard(existing.lora_int_id)
        await state.engine_client.remove_lora(existing.lora_int_id)
    logger.info("engine_ext.evict_lora", extra={"lora_name": lora_name, "lora_int_id": existing.lora_int_id})
    return {"lora_name": lora_name, "lora_int_id": existing.lora_int_id, "tier": "disk"}


async def engine_residency(state: Any) -> dict[str, Any] | None:
    """The engine's own LoRA lists, read in its worker (``inference.node.worker_ext``) through ``collective_rpc``.

    Returns:
        Worker 0's ``quiver_lora_residency()`` (``gpu``, ``cpu``, ``pinned``, ``bytes``, ``slot_bytes``, …), or None
        when the worker extension is not mounted or the call fails (the caller falls back to ``list_loras``).
    """
    try:
        answers = await state.engine_client.collective_rpc("quiver_lora_residency")
    except Exception as exc:  # extension not mounted (AttributeError in the worker) or engine trouble
        logger.warning("engine_ext.residency_unavailable", extra={"error": str(exc)})
        return None
    if not answers or not isinstance(answers[0], dict) or not answers[0].get("enabled"):
        return None
    return answers[0]


async def list_loras(state: Any) -> dict[str, Any]:
    """Describe the served adapters and where each one is in the engine.

    Args:
        state: the API server's `app.state`.

    Returns:
        `{"loras": [{"lora_name", "lora_int_id", "lora_path", "pinned", "in_engine", "tier", "bytes"}],
        "engine_lora_int_ids": [int], "residency": {...} | None}`; `engine_lora_int_ids` is the engine's own
        `list_loras()` (its CPU cache). `tier` is `gpu` (in one of the `max_loras`
        slots), `cpu` (in the engine's CPU cache only) or `disk` (served by name; the engine's LRU dropped it, so
        its next request reloads it from `lora_path`); `bytes` is its CPU copy's size (0 when not in the engine).
        `residency` is the worker's own lists (`engine_residency`); without it, `tier` is `cpu` for every id in
        `list_loras` and GPU cannot be told apart.
    """
    residency = await engine_residency(state)
    listed = {int(i) for i in await state.engine_client.list_loras()}
    if residency is not None:
        in_engine = set(residency["cpu"])
        gpu = set(residency["gpu"])
        sizes = {int(k): int(v) for k, v in residency["bytes"].items()}
        pinned = set(residency["pinned"])
    else:
        in_engine, gpu, sizes, pinned = listed, set(), {}, _pinned(state)
    loras = []
    for req in state.openai_serving_models.lora_requests.values():
        lora_id = req.lora_int_id
        tier = "gpu" if lora_id in gpu else ("cpu" if lora_id in in_engine else "disk")
        loras.append({
            "lora_name": req.lora_name,
            "lora_int_id": lora_id,
            "lora_path": req.lora_path,
            "pinned": lora_id in pinned or lora_id in _pinned(state),
            "in_engine": lora_id in in_engine,
            "tier": tier,
            "bytes": sizes.get(lora_id, 0),
        })
    return {"loras": loras, "engine_lora_int_ids": sorted(listed), "residency": residency}


EVICTION_POLICIES = ("lru", "lfu", "cost")


async def eviction_policy(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Set the policy that picks the victim of a load into a full CPU cache, in every worker
    (``inference.node.worker_ext``): the node agent sends its own ``QUIVER_EVICTION_POLICY`` so agent and engine
    rank alike, also after an engine restart.

    Args:
        state: the API server's `app.state`.
        body: `{"policy": "lru" | "lfu" | "cost"}`.

    Returns:
        `{"policy": str}`.

    Raises:
        ExtensionError: 400 `invalid_policy`; 503 `worker_extension_missing` (engine started without
            ``--worker-extension-cls``).
    """
    policy = _require_str(body, "policy")
    if policy not in EVICTION_POLICIES:
        raise ExtensionError(400, "invalid_policy", f"policy must be one of {', '.join(EVICTION_POLICIES)}")
    try:
        answers = await state.engine_client.collective_rpc("quiver_set_eviction_policy", args=(policy,))
    except Exception as exc:  # extension not mounted (AttributeError in the worker) or engine trouble
        raise ExtensionError(503, "worker_extension_missing", f"the workers could not set it: {exc}") from exc
    logger.info("engine_ext.eviction_policy", extra={"policy": policy, "workers": len(answers or ())})
    return {"policy": policy}


def _ids(body: dict[str, Any], key: str) -> list[int]:
    value = body.get(key, [])
    if (not isinstance(value, list) or len(value) > 10_000
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
        raise ExtensionError(400, "invalid_request", f"'{key}' must be a list of at most 10,000 integers")
    return value


async def eviction_hints(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Give every worker the control plane's eviction hints (``inference.node.worker_ext``), so that a reload inside
    the engine ranks victims as the agent does (``inference.policy.node_eviction.node_victims``).

    Args:
        state: the API server's `app.state`.
        body: `{"over_quota": [lora_int_id], "elsewhere": [lora_int_id], "valid_s": seconds}`: adapters of tenants
            at or over their residency quota, adapters the plan puts on other nodes only, and how long the hints
            hold (after that the workers rank by policy alone).

    Returns:
        `{"over_quota": n, "elsewhere": n}`.

    Raises:
        ExtensionError: 400 `invalid_request`; 503 `worker_extension_missing`.
    """
    over_quota, elsewhere = _ids(body, "over_quota"), _ids(body, "elsewhere")
    valid_s = body.get("valid_s", 0)
    if not isinstance(valid_s, int | float) or isinstance(valid_s, bool) or not 0 <= valid_s <= 3600:
        raise ExtensionError(400, "invalid_request", "'valid_s' must be a number of seconds in 0..3600")
    try:
        await state.engine_client.collective_rpc("quiver_set_eviction_hints",
                                                 args=(over_quota, elsewhere, float(valid_s)))
    except Exception as exc:  # extension not mounted (AttributeError in the worker) or engine trouble
        raise ExtensionError(503, "worker_extension_missing", f"the workers could not take them: {exc}") from exc
    return {"over_quota": len(over_quota), "elsewhere": len(elsewhere)}


async def abort(state: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Abort requests by their external id (vLLM's ``AsyncLLM.abort(request_ids, internal=False)``,
    ``vllm/v1/engine/async_llm.py``): each stream ends at once with ``finish_reason`` ``"abort"``, its final usage
    chunk (what the engine generated for every choice) and ``[DONE]``. Unknown or finished ids are ignored.

    Args:
        state: the API server's `app.state` (needs `engine_client`).
        body: `{"request_ids": [str]}`: at most 256 ids of at most 200 characters each, as vLLM's OpenAI server
            named them (`cmpl-<X-Request-Id>-<prompt index>`, `chatcmpl-<X-Request-Id>`).

    Returns:
        `{"aborted": n}` (the ids passed on, known or not).

    Raises:
        ExtensionError: 400 `invalid_request`.
    """
    ids = body.get("request_ids")
    if (not isinstance(ids, list) or not 0 < len(ids) <= 256
            or not all(isinstance(i, str) and 0 < len(i) <= 200 for i in ids)):
        raise ExtensionError(400, "invalid_request",
                             "'request_ids' must be a list of 1 to 256 strings of at most 200 characters")
    await state.engine_client.abort(ids)
    return {"aborted": len(ids)}


_POST_ROUTES = {"abort": abort, "add_lora": add_lora, "remove_lora": remove_lora, "evict_lora": evict_lora, "pin_lora": pin_lora,
                "eviction_policy": eviction_policy, "eviction_hints": eviction_hints}


def _configured_token_digests() -> list[bytes]:
    keys = [k for k in os.environ.get("VLLM_API_KEY", "").split(",") if k]
    return [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]


# Served without the node key: liveness (the gateway's probe after a broken exchange) and Prometheus' scrape.
OPEN_PATHS = frozenset({"/health", "/metrics"})


class QuiverEngineExtension:
    """Pure ASGI middleware serving `/quiver/v1/*` and guarding every other path with the node key.

    vLLM checks `VLLM_API_KEY` on `/v1/*` only; with runtime LoRA updating on it also serves SageMaker-style
    `POST/DELETE /adapters` (register any folder on the node under a served name: a tenant's adapter swapped for
    another's weights), `/invocations` (inference with no key, metering or `cache_salt`), `/tokenize` and more,
    all without a key (found by attacking the demo stack). So every path but ``OPEN_PATHS`` needs the node key here.

    Args:
        app: the next ASGI application (vLLM's middleware stack and router).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._token_digests = _configured_token_digests()

    def _authorized(self, headers: Headers) -> bool:
        if not self._token_digests:
            return False
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        return any(hmac.compare_digest(digest, d) for d in self._token_digests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle `/quiver/v1/*` requests; delegate everything else to `self.app`.

        Without `VLLM_API_KEY` the server's lifespan startup fails (uvicorn exits) and any request gets 503.
        """
        if not self._token_digests:
            await _refuse_to_serve(scope, receive, send)
            return
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if not scope["path"].startswith(PREFIX):
            if not self._authorized(Headers(scope=scope)):
                await JSONResponse({"error": {"message": "Unauthorized", "type": "invalid_request_error",
                                              "code": "unauthorized"}}, status_code=401)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        response = await self._handle(scope, receive)
        await response(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive) -> JSONResponse:
        if not self._authorized(Headers(scope=scope)):
            return JSONResponse({"detail": "Unauthorized", "code": "unauthorized"}, status_code=401)
        route = scope["path"][len(PREFIX) :]
        method = scope["method"]
        state = scope["app"].state
        try:
            if route == "loras" and method == "GET":
                return JSONResponse(await _unless_engine_dead(state, list_loras(state)))
            handler = _POST_ROUTES.get(route)
            if handler is None:
                return JSONResponse({"detail": "Not found.", "code": "not_found"}, status_code=404)
            if method != "POST":
                return JSONResponse(
                    {"detail": "Method not allowed.", "code": "method_not_allowed"}, status_code=405
                )
            body = await _read_json(receive)
            return JSONResponse(await _unless_engine_dead(state, handler(state, body)))
        except ExtensionError as exc:
            return JSONResponse({"detail": exc.detail, "code": exc.code}, status_code=exc.status)


async def _unless_engine_dead(state: Any, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Await ``work`` (a route's calls into the engine), or fail with 503 ``engine_dead`` once the engine has died.

    vLLM never fails a utility call (``collective_rpc``, ``add_lora``...) that is in flight when its EngineCore dies
    (``MPClient._call_utility_async`` awaits a future that only an output of the dead core would resolve): the route
    would wait forever, and with it uvicorn's shutdown ("Waiting for background tasks to complete"), so the API server
    never exits and no supervisor restarts it (a SIGKILLed EngineCore under load, with the agent's eviction hints every
    2 s in flight, left the node wedged: attack round). ``state.engine_client.errored`` turns true once it died.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=ENGINE_ALIVE_POLL_S)
            if done:
                return task.result()
            if getattr(state.engine_client, "errored", False):
                raise ExtensionError(503, "engine_dead", "the engine died while this call waited on it")
    finally:
        if not task.done():
            task.cancel()


NO_KEY = ("VLLM_API_KEY is not set: this engine would serve anyone; start it with the node key "
          "(inference.node.launch, or VLLM_API_KEY=<QUIVER_NODE_KEY>).")


async def _refuse_to_serve(scope: Scope, receive: Receive, send: Send) -> None:
    logger.error("engine_ext.no_api_key")
    if scope["type"] == "lifespan":
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.failed", "message": NO_KEY})
        return
    if scope["type"] == "http":
        await JSONResponse({"detail": NO_KEY, "code": "engine_without_key"}, status_code=503)(scope, receive, send)


async def _read_json(receive: Receive) -> dict[str, Any]:
    """The request's JSON object: at most ``MAX_BODY_BYTES`` (the longest is an abort of 256 ids, ~60 KB), read no
    further than that.

    Raises:
        ExtensionError: 413 ``body_too_large``; 400 ``invalid_json`` (not JSON, or nested too deep to parse),
            ``invalid_request`` (not an object).
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            raise ExtensionError(413, "body_too_large", f"request body over {MAX_BODY_BYTES} bytes")
        if not message.get("more_body", False):
            break
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except (ValueError, RecursionError) as exc:
        raise ExtensionError(400, "invalid_json", "request body is not JSON (or is nested too deep)") from exc
    if not isinstance(body, dict):
        raise ExtensionError(400, "invalid_request", "request body must be a JSON object")
    return body
