"""The gateway's fast path: a lean ASGI app for ``POST /v1/completions`` and ``POST /v1/chat/completions``.

Mounted in front of Django by ``config.asgi`` (Django keeps ``/v1/models`` and answers other ``/v1/*`` paths).
Measured on this machine (``scripts/bench_gateway``), Django's request path alone cost more than the whole 2 ms
budget, so these two routes bypass it while reading the same models and settings.

A request: key → tenant from the in-process :class:`~inference.gateway.directory.Directory` (no database query),
``model`` → target, node choice over the cached fleet view (:func:`~inference.gateway.snapshot.node_choose`), one
pooled upstream client, usage emitted to :class:`~inference.gateway.usage_sink.UsageSink`. A cold adapter is warmed
through a worker while the request waits (bounded by ``QUIVER_WARM_WAIT_S``) on the shared fleet view, holding no
database connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import anyio
from django.conf import settings
from django.utils import timezone
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from common.echo import clip
from inference.fleet.warming import placement_mark_not_served, warm_for_request
from inference.gateway import hygiene, metrics
from inference.gateway.admission import AdmissionGate
from inference.gateway.bus import subscribe_forever
from inference.gateway.directory import Directory, db_call
from inference.gateway.errors import GatewayError
from inference.gateway.limits import RateLimiter, estimate_prompt_tokens, limits_mode_log
from inference.gateway.limits import Scope as LimitScope
from inference.gateway.snapshot import FleetView, KeyView, NodeView, TargetView, node_choose
from inference.gateway.upstream import (
    UpstreamError,
    UpstreamRefused,
    UpstreamResponse,
    engine_answers,
    upstream_close,
    upstream_post,
)
from inference.gateway.usage_sink import UsageSink
from inference.metering.usage import usage_row
from inference.policy.routing import RouteConfig

logger = logging.getLogger(__name__)
ROUTES = {"/v1/completions": "completions", "/v1/chat/completions": "chat/completions"}
POLL_S = 0.2
# Engine 404s for an adapter the fleet view said was served, answered by routing again (each bounded by the warm wait).
MAX_REROUTES = 3
# While a request waits for its adapter's warm, it asks for the warm again this often (seconds).
REWARM_S = 2.0
# A request waiting for a warm on the plan's home goes to a node that came to serve the version meanwhile after this
# long (seconds). A move while another node already serves it does not wait at all (GatewayApp._move).
MOVE_WAIT_S = 5.0
INFERENCE_SCOPE = "inference"
# Longest `model` looked up: served names are `<tenant>--<adapter>--<pk>` (slugs of at most 40), base model names
# are Hugging Face-style ids (at most 96 on the Hub).
MODEL_MAX_CHARS = 256
VERIFIED_MAX = 10_000


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, headers=headers,
                    media_type="application/json")


def error_response(exc: GatewayError) -> Response:
    """OpenAI's ``{"error": {...}}`` for ``exc``, with ``WWW-Authenticate`` on 401 and ``Allow`` on 405."""
    headers = dict(exc.headers)
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="quiver"'
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return _json(body, exc.status, headers)


def _touch_last_used(key_pk: int) -> None:
    from tenants.models import ApiKey

    now = timezone.now()
    interval = timedelta(seconds=settings.QUIVER_API_KEY_LAST_USED_INTERVAL_S)
    ApiKey.objects.filter(pk=key_pk).exclude(last_used_at__gt=now - interval).update(last_used_at=now)


# What a request without max_tokens may generate: vLLM's completions default, and a budget for chat. Under a TPM
# limit it is also sent as max_tokens, so the tokens reserved bound the tokens billed.
DEFAULT_COMPLETION_RESERVE = {"completions": 16, "chat/completions": 256}


def _scopes(key: KeyView) -> list[LimitScope]:
    return [LimitScope(f"tenant:{key.tenant_id}", f"tenant {key.tenant_slug}", key.tenant_limits),
            LimitScope(f"key:{key.pk}", f"API key {key.key_id}", key.key_limits)]


def _completion_budget(upstream: dict[str, Any], endpoint: str) -> int:
    """Completion tokens to hold on admission (with the estimated prompt): the completion budget × ``n`` × the
    prompts."""
    budget = hygiene.requested_tokens(upstream)
    if budget is None:
        budget = DEFAULT_COMPLETION_RESERVE[endpoint] * int(upstream.get("n", 1)) * hygiene.prompt_count(upstream)
    return budget


def _caps(key: KeyView) -> hygiene.Caps:
    caps = [c for c in (key.tenant_limits.max_tokens, key.key_limits.max_tokens) if c is not None]
    return hygiene.Caps(max_tokens=min(caps) if caps else None, n=settings.QUIVER_GATEWAY_MAX_N,
                        logprobs=settings.QUIVER_GATEWAY_MAX_LOGPROBS)


class GatewayApp:
    """The ASGI app; one instance per process. Background tasks (invalidation subscriber, usage flusher) start on
    the first request or at lifespan start-up, once per event loop; ``background=False`` (tests driving the app
    in a short-lived loop) starts none, so usage stays in ``sink``."""

    def __init__(self, *, background: bool = True) -> None:
        self.background = background
        self.directory = Directory()
        self.sink = UsageSink()
        self.limiter = RateLimiter()
        self.admission = AdmissionGate()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_touch: dict[int, float] = {}
        self._verified: dict[str, tuple[KeyView, str]] = {}  # key_id -> (the view a secret matched, that secret)
        self._background: set[asyncio.Task[Any]] = set()
        # Nodes whose engine refused a connection: node pk -> monotonic time until which this process skips them.
        self._down: dict[int, float] = {}
        self._turn = 0  # requests routed by this process (the round-robin baseline's position)
        self._route_config = RouteConfig()
        self._moves: dict[tuple[int, int], float] = {}  # (version, new home) -> monotonic time until it may be re-asked

    # --- process plumbing
    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self.sink = UsageSink()
        self.directory = Directory()
        self.limiter = RateLimiter()  # its Redis client belongs to this loop
        self.admission = AdmissionGate()
        if self.background:
            self._tasks = [loop.create_task(subscribe_forever(self.directory)),
                           loop.create_task(self.sink.run_forever()),
                           loop.create_task(self.admission.run_forever())]

    async def shutdown(self) -> None:
        """Flush usage, stop background tasks, close the upstream pool."""
        await self.sink.flushed(timeout=5.0)
        for task in self._tasks:
            task.cancel()
        await upstream_close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry: ``http`` for the two routes, ``lifespan`` start-up/shutdown."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        self._ensure_started()
        endpoint = ROUTES.get(scope["path"])
        if endpoint is None:
            response = error_response(GatewayError(404, f"Unknown route {clip(scope['path'])}.", code="not_found"))
        elif scope["method"] != "POST":
            response = error_response(GatewayError(405, f"Use POST for {clip(scope['path'])}.", code="method_not_allowed",
                                                   headers={"Allow": "POST"}))
        else:
            response = await self.handle(Request(scope, receive), endpoint)
        await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._ensure_started()
                limits_mode_log()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- the request
    async def authenticate(self, request: Request) -> KeyView:
        """The calling key, from the cache.

        Raises:
            GatewayError: 401 missing/unknown/revoked/expired key, 403 without the ``inference`` scope.
        """
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <api key>'.",
                               code="invalid_api_key", type_="authentication_error")
        invalid = GatewayError(401, "Invalid, revoked or expired API key.", code="invalid_api_key",
                               type_="authentication_error")
        prefix = f"{settings.QUIVER_API_KEY_PREFIX}_"
        key_id, dot, secret = token[len(prefix):].partition(".")
        if not token.startswith(prefix) or not dot or not key_id or len(key_id) > 16 or not token.isascii():
            raise invalid  # keys are ASCII; compare_digest refuses non-ASCII str (a 500 for anyone who knew a key id)
        key = await self.directory.keys.get(key_id)
        if key is None or not self._secret_ok(key, secret):
            raise invalid
        if not key.enabled or (key.expires_at is not None and key.expires_at <= timezone.now()):
            raise invalid
        if INFERENCE_SCOPE not in key.scopes:
            raise GatewayError(403, "This API key lacks the 'inference' scope.", code="insufficient_scope",
                               type_="permission_error")
        now = time.monotonic()
        if now - self._last_touch.get(key.pk, -1e9) >= settings.QUIVER_API_KEY_LAST_USED_INTERVAL_S:
            self._last_touch[key.pk] = now
            self._spawn(db_call(_touch_last_used, key.pk))
        return key

    def _secret_ok(self, key: KeyView, secret: str) -> bool:
        # The HMAC is computed once per cached key view and secret: a reloaded view (revocation, rotation) is a new
        # object, so it is checked afresh.
        seen = self._verified.get(key.key_id)
        if seen is not None and seen[0] is key and hmac.compare_digest(seen[1], secret):
            return True
        if not key.secret_matches(secret, settings.QUIVER_API_KEY_HMAC_KEY.encode()):
            return False
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()
        self._verified[key.key_id] = (key, secret)
        return True

    async def resolve(self, key: KeyView, model: str) -> TargetView:
        """``model`` → the base model or the tenant's newest ready version.

        Raises:
            GatewayError: 404 ``model_not_found`` (unknown or another tenant's), 409 ``adapter_not_ready``.
        """
        target = await self.directory.targets.get(key.tenant_id, model)
        if target == "not_found" or not isinstance(target, TargetView):
            if target == "not_ready":
                raise GatewayError(409, f"Adapter `{model}` has no ready version yet; wait for validation or check "
                                   "its report.", code="adapter_not_ready", param="model")
            raise GatewayError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")
        return target

    async def node_for(self, target: TargetView) -> NodeView:
        """A node ready to serve ``target``, warming a cold adapter with a bounded wait.

        Raises:
            GatewayError: 503 ``no_capacity`` (no live node), ``adapter_load_failed`` or ``adapter_warm_timeout``.
        """
        fleet = self._routable(await self.directory.fleet())
        node = node_choose(fleet, target, **self._policy())
        if node is not None and (target.version_id is None or fleet.serves(node.pk, target.version_id)):
            return node
        no_node = GatewayError(503, f"No live node serves base model `{target.base_model_name}`.",
                               code="no_capacity", type_="server_error")
        # Round-robin picks nodes that may not hold the version: it is loaded where the turn fell.
        pinned_to = node.pk if node is not None else None
        if target.version_id is None:
            raise no_node
        if pinned_to is not None and settings.QUIVER_ROUTING_POLICY != "round_robin":
            holder = self._holder(fleet, target)
            if holder is not None:
                # Make before break: the plan moved the version to a node that does not hold it yet. Warm it there
                # in the background and serve this request where it is now; later requests go to the new home once
                # it serves the version. Waiting for the move cost the request a control-plane warm (up to
                # MOVE_WAIT_S): bench_fleet's re-plans moved tail adapters every 30 s and set its p99 TTFT.
                self._move(target.version_id, pinned_to)
                return holder
        warm_node = await db_call(warm_for_request, target.version_id, pinned_to)
        if warm_node is None:
            raise no_node
        asked_at = time.monotonic()
        deadline = asked_at + settings.QUIVER_WARM_WAIT_S
        asked_again = asked_at
        # A move to the plan's home (affinity chose a node that does not hold it yet) waits at most MOVE_WAIT_S
        # while another node still serves the version: a slow or lost warm must not cost the request its answer.
        moving = pinned_to is not None and settings.QUIVER_ROUTING_POLICY != "round_robin"
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            fleet = self._routable(await self.directory.fleet_fresh(POLL_S))
            holder = self._holder(fleet, target)
            if pinned_to is not None:
                node = next((n for n in fleet.nodes if n.pk == pinned_to), None)
                if node is not None and fleet.serves(node.pk, target.version_id):
                    return node
                if holder is not None and (node is None or (moving and time.monotonic() - asked_at >= MOVE_WAIT_S)):
                    return holder
                if node is None:
                    pinned_to = None  # the node it was warming on left the fleet: warm it on the best live one
                    asked_again = float("-inf")
            else:
                node = node_choose(fleet, target, **self._policy())
                if node is not None and fleet.serves(node.pk, target.version_id):
                    return node
                if holder is not None:
                    return holder  # its home is not it (no plan when it was asked, or the plan moved)
            if time.monotonic() - asked_again >= REWARM_S:
                warm_live = any(n.pk == warm_node for n in fleet.nodes)
                # Ask again: under eviction pressure the node can drop the adapter between its warm and this
                # poll, and nothing else would load it again (a request waited out the whole warm wait in
                # bench_fleet). Same node while it is live (a warm in flight makes this a no-op,
                # placement_request_warm); once it is gone (killed, refusing connections), the best live node.
                asked_again = time.monotonic()
                rewarm_node = await db_call(warm_for_request, target.version_id, warm_node if warm_live else None)
                if rewarm_node is None:
                    raise no_node
                warm_node = rewarm_node
            error = fleet.warm_error(target.version_id) if fleet.read_at > asked_at else ""
            if error:
                if holder is not None:
                    return holder  # the move to its plan's home failed; the node that holds it still serves
                raise GatewayError(503, f"Loading adapter `{target.requested}` onto a node failed ({error}); "
                                   "retry, and contact the operator if it persists.",
                                   code="adapter_load_failed", type_="server_error")
        holder = self._holder(self._routable(await self.directory.fleet_fresh(POLL_S)), target)
        if holder is not None:
            return holder
        raise GatewayError(503, f"Adapter `{target.requested}` is still loading; retry shortly.",
                           code="adapter_warm_timeout", type_="server_error")

    def _move(self, version_id: int, node_pk: int) -> None:
        """Ask, in the background, for ``version_id`` to be warmed on node ``node_pk`` (its new home), at most once per
        ``REWARM_S`` per (version, node) in this process (``placement_request_warm`` also drops duplicates)."""
        now = time.monotonic()
        if self._moves.get((version_id, node_pk), 0.0) > now:
            return
        if len(self._moves) >= VERIFIED_MAX:
            self._moves = {k: until for k, until in self._moves.items() if until > now}
        self._moves[version_id, node_pk] = now + REWARM_S
        self._spawn(self._move_warm(version_id, node_pk))

    @staticmethod
    async def _move_warm(version_id: int, node_pk: int) -> None:
        try:
            await db_call(warm_for_request, version_id, node_pk)
        except GatewayError as exc:  # the database is away: the next request (or the reconciler) asks again
            logger.warning("gateway.move_warm_failed", extra={"version_id": version_id, "error": exc.message})

    def _holder(self, fleet: FleetView, target: TargetView) -> NodeView | None:
        """A node that serves ``target``'s version now, the plan aside (affinity's choice among the holders)."""
        if target.version_id is None:
            return None
        node = node_choose(replace(fleet, homes={}), target)
        return node if node is not None and fleet.serves(node.pk, target.version_id) else None

    @staticmethod
    async def _read_raw(request: Request) -> bytes:
        limit = settings.QUIVER_MAX_JSON_BYTES
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise GatewayError(413, f"Request body over {limit} bytes.", code="request_too_large")
                chunks.append(chunk)
        except ClientDisconnect as exc:
            raise GatewayError(400, "The request body was cut off.", code="invalid_json") from exc
        return b"".join(chunks)

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw or b"{}")
        except RecursionError as exc:  # not a ValueError: nesting past the parser's depth limit
            raise GatewayError(400, "Request body is nested too deeply to be an OpenAI request.",
                               code="invalid_json") from exc
        except ValueError as exc:
            raise GatewayError(400, "Request body must be JSON.", code="invalid_json") from exc
        if not isinstance(body, dict):
            raise GatewayError(400, "Request body must be a JSON object.", code="invalid_json")
        if LONE_SURROGATE_ESCAPE.search(raw):
            _refuse_lone_surrogates(body)
        model = body.get("model")
        if model is None or model == "":
            raise GatewayError(400, "Field 'model' is required: your adapter's name or the base model.",
                               code="missing_model", param="model")
        if not isinstance(model, str):
            raise GatewayError(400, f"Invalid 'model': expected a string (your adapter's name or the base model), "
                               f"got {type(model).__name__}.", code="invalid_type", param="model")
        if len(model) > MODEL_MAX_CHARS or "\x00" in model:
            # Checked before any lookup: unknown names are cached per tenant (and were echoed back whole), so a
            # 4 MiB name per request grew the process by ~4 MB each; PostgreSQL refuses NUL in text (a 500).
            raise GatewayError(400, f"Invalid 'model': at most {MODEL_MAX_CHARS} characters and no NUL; use your "
                               "adapter's name or the base model's.", code="invalid_value", param="model")
        return body

    async def handle(self, request: Request, endpoint: str) -> Response:
        """Authenticate, resolve, route and proxy one completion request."""
        started = time.monotonic()
        arrived = time.time()
        try:
            # The key before the body: the front door lets this path's bodies up to QUIVER_MAX_JSON_BYTES on the
            # word of any Authorization header, so junk credentials must not get a byte read (the cap still
            # answers 413 for a good key's oversized body).
            key = await self.authenticate(request)
            raw = await self._read_raw(request)
            body = self._parse(raw)
            upstream = hygiene.upstream_body(body, endpoint=endpoint, caps=_caps(key),
                                             salt=hygiene.cache_salt(key.tenant_id, settings.SECRET_KEY))
            target = await self.resolve(key, body["model"])
            scopes = _scopes(key)
            if hygiene.requested_tokens(upstream) is None and any(s.limits.tpm is not None for s in scopes):
                # Under a TPM limit the reservation must bound what the engine generates: without max_tokens vLLM
                # runs to the end of the context (a chat reserved 256 tokens and was billed 509, twice over 600).
                # At least min_tokens, which vLLM refuses above max_tokens.
                upstream["max_tokens"] = max(DEFAULT_COMPLETION_RESERVE[endpoint], upstream.get("min_tokens") or 0)
            # After hygiene and the model's lookup: a malformed body or unknown model gets its 400/404 before a
            # request too large for a TPM limit gets its (non-retryable) 429.
            # Estimated once: a body's tools are serialised for it, tens of ms on the event loop for a 4 MB one.
            prompt_estimate = estimate_prompt_tokens(upstream)
            completion_estimate = _completion_budget(upstream, endpoint)
            admission = await self.limiter.admit(
                scopes, reserve=prompt_estimate + completion_estimate, prompt_tokens=prompt_estimate,
                length_field="max_completion_tokens" if "max_completion_tokens" in upstream else "max_tokens")
        except GatewayError as exc:
            if exc.status == 429:
                metrics.RATE_LIMITED.labels(exc.type).inc()
            return error_response(exc)
        try:
            # KV-pressure admission (inference.gateway.admission): at once unless every eligible node is saturated.
            node, slot = await self.admission.acquire(tenant=str(key.tenant_id), priority=key.priority,
                                                      prompt_tokens=prompt_estimate,
                                                      completion_tokens=completion_estimate,
                                                      choose=lambda: self.node_for(target),
                                                      lora=target.served_name if target.version_id is not None
                                                      else None)
        except GatewayError as exc:
            await self.limiter.settle(admission, actual_tokens=0)
            return error_response(exc)
        limit_headers = admission.headers if admission else {}
        upstream["model"] = target.served_name
        engine_priority = self.admission.engine_priority(node, key.priority)
        if engine_priority is not None:
            upstream["priority"] = engine_priority
        stream = bool(upstream.get("stream"))
        if stream:
            interval = self.admission.engine_stream_interval(node, str(key.tenant_id))
            if interval is not None:
                upstream["stream_interval"] = interval
        client_options = upstream.get("stream_options") or {}
        keep_usage = bool(client_options.get("include_usage"))
        if stream:
            # Running counts on every chunk: a stream cut short is still billed the tokens it delivered.
            upstream["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}

        def record(status: int, usage: dict[str, Any] | None, ttft_ms: float | None = None) -> None:
            self.admission.release(slot)
            prompt_tokens = int((usage or {}).get("prompt_tokens") or 0)
            completion_tokens = int((usage or {}).get("completion_tokens") or 0)
            if admission is not None:
                self._spawn(self.limiter.settle(admission, actual_tokens=prompt_tokens + completion_tokens))
            self.admission.charge(str(key.tenant_id), prompt_tokens=prompt_tokens - prompt_estimate,
                                  completion_tokens=completion_tokens - completion_estimate)
            metrics.request_observe(endpoint=endpoint, status=status, served_name=target.served_name,
                                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                    latency_s=time.monotonic() - started,
                                    ttft_s=None if ttft_ms is None else ttft_ms / 1000)
            self.sink.emit(usage_row(
                tenant_id=key.tenant_id, api_key_id=key.pk, adapter_version_id=target.version_id,
                base_model_id=target.base_model_id, node_id=node.pk, model_name=target.requested,
                version_number=target.version_number, endpoint=endpoint, stream=stream, status_code=status,
                usage=usage, latency_ms=(time.monotonic() - started) * 1000, ttft_ms=ttft_ms, created_at=arrived))

        content = json.dumps(upstream).encode()

        async def proxy() -> Response:
            nonlocal node
            reroutes = 0
            try:
                while True:
                    try:
                        response = await upstream_post(f"{node.engine_url}/v1/{endpoint}", content=content,
                                                       node_key=node.key)
                    except UpstreamError as exc:
                        # No response came. A refused connection reached no engine; a connection that broke before the
                        # answer (a kept-alive one to an engine that died) counts too when the engine's health check
                        # now gets no answer: the dead engine answers no one, so the request may go to another node.
                        # This process skips the node until heartbeats would have aged it out of routing everywhere.
                        refused = isinstance(exc, UpstreamRefused)
                        if not refused and await engine_answers(node.engine_url):
                            raise
                        logger.warning("gateway.upstream_refused", extra={"node": node.name, "error": repr(exc)})
                        self._down[node.pk] = time.monotonic() + settings.QUIVER_NODE_STALE_AFTER_S
                        try:
                            node = await self.node_for(target)
                        except GatewayError:
                            raise exc from None
                        continue
                    if response.status_code == 404 and target.version_id is not None and reroutes < MAX_REROUTES:
                        # The engine no longer serves the adapter (evicted, unloaded, engine restarted) while this
                        # process's fleet view, up to a heartbeat plus the refresh interval old, still said it did.
                        # Record what the engine said, then route again from a fresh view: another replica, or a warm.
                        # More than once: with more adapters than CPU slots, a node can evict the adapter again between
                        # its warm and this request's arrival (bench_fleet, 16 adapters over 8 slots).
                        reroutes += 1
                        await response.aclose()
                        logger.info("gateway.adapter_not_served", extra={"node": node.name,
                                                                         "version_id": target.version_id})
                        await db_call(placement_mark_not_served, node.pk, target.version_id)
                        self.directory.invalidate("fleet")
                        try:
                            node = await self.node_for(target)
                        except GatewayError as exc:
                            record(exc.status, None)
                            return error_response(exc)
                        continue
                    break
            except UpstreamError as exc:
                logger.warning("gateway.upstream_unreachable %r", exc, extra={"node": node.name, "error": repr(exc)})
                record(502, None)
                return error_response(GatewayError(502, "The inference node did not answer; retry.",
                                                   code="upstream_unreachable", type_="server_error"))
            except BaseException:  # cancelled (the client went away) before any answer: free the slot now
                self.admission.release(slot)
                raise
            if response.status_code >= 400 or not stream:
                try:
                    raw = await response.aread()
                except UpstreamError as exc:
                    logger.warning("gateway.upstream_failed", extra={"node": node.name, "error": repr(exc)})
                    record(502, None)
                    return error_response(GatewayError(502, "The inference node stopped answering; retry.",
                                                       code="upstream_failed", type_="server_error"))
                except BaseException:
                    self.admission.release(slot)
                    raise
                finally:
                    await response.aclose()
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = None
                if response.status_code >= 400 or not isinstance(data, dict):
                    failed = _engine_error(response.status_code, data, target, node_name=node.name,
                                           endpoint=endpoint)
                    # An engine that refused the node's key is metered as what the caller got (502), not as a 401.
                    status = failed.status if response.status_code in ENGINE_AUTH_STATUSES else response.status_code
                    record(status if response.status_code >= 400 else 502, None)
                    return error_response(failed)
                data["model"] = target.requested
                _strip_engine_fields(data)
                self.admission.release(slot)
                return _RecordedResponse(data, headers=limit_headers, record=lambda: record(200, data.get("usage")))
            # A stream can outlive its concurrency lease and its running-slot hold (the proxy timeout bounds each
            # read, not the stream): the relay renews both on a timer, a third of a lease apart, until it ends.
            async def renew() -> None:
                self.admission.renew(slot)
                if admission is not None and admission.holds_lease:
                    await self.limiter.renew(admission)

            return relay_response(response, target=target, keep_usage=keep_usage, record=record, started=started,
                                  headers=limit_headers, renew=renew, renew_every_s=self.admission.hold_s() / 3)

        if stream:
            return await proxy()
        # A JSON answer is only sent at the end: a client that leaves before it must not keep the engine
        # generating (and its concurrency slot held) for nothing. Its request is cut and metered 499.
        return await self._unless_client_gone(request, proxy(), gone=lambda: record(499, None))

    @staticmethod
    async def _unless_client_gone(request: Request, work: Any, *, gone: Any) -> Response:
        """Await ``work`` (the engine exchange of a non-streaming request) unless the client disconnects first: then
        cancel it (closing the engine connection, so vLLM aborts the request), call ``gone()`` and answer 499.

        One watcher task, which cancels this one: cheaper on the hot path than running ``work`` as a task of its own.
        """
        current = asyncio.current_task()
        left: list[bool] = []

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            left.append(True)
            if current is not None:
                current.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            return await work
        except asyncio.CancelledError:
            if not left or current is None:
                raise
            current.uncancel()
        finally:
            watcher.cancel()
        logger.info("gateway.client_gone", extra={"path": request.url.path})
        gone()
        return error_response(GatewayError(499, "The client closed the request before the answer.",
                                           code="client_closed_request", type_="invalid_request_error"))

    def _policy(self) -> dict[str, Any]:
        """``node_choose``'s routing arguments: ``QUIVER_ROUTING_POLICY``, for round-robin this process's turn, and the
        thresholds (``QUIVER_ROUTING_LOAD_BOUND``)."""
        self._turn += 1
        bound = settings.QUIVER_ROUTING_LOAD_BOUND
        if self._route_config.load_bound != bound:
            self._route_config = RouteConfig(load_bound=bound)
        return {"policy": settings.QUIVER_ROUTING_POLICY, "turn": self._turn, "config": self._route_config}

    def _routable(self, fleet: FleetView) -> FleetView:
        """``fleet`` with fresh load figures (``AdmissionGate.fleet_view``), without the nodes this process found
        refusing connections within the stale window."""
        fleet = self.admission.fleet_view(fleet)
        now = time.monotonic()
        down = {pk for pk, until in self._down.items() if until > now}
        if not down:
            self._down.clear()
            return fleet
        return replace(fleet, nodes=tuple(n for n in fleet.nodes if n.pk not in down))

    @staticmethod
    async def _relay(upstream: UpstreamResponse, *, target: TargetView, keep_usage: bool, record: Any,
                     started: float, renew: Callable[[], Awaitable[None]] | None = None,
                     renew_every_s: float = 0.0) -> AsyncGenerator[bytes, None]:
        """Relay the engine's SSE stream with ``model`` renamed; meter what was actually sent.

        Ends as: ``[DONE]`` relayed → the engine's status; the engine's stream cut → an OpenAI error event, 502;
        an engine error event → ours in its place, with the mapped status (``_engine_error``); the client gone → 499. Tokens are the engine's running ``usage`` (``continuous_usage_stats``).

        ``renew`` (the concurrency lease's renewal, ``RateLimiter.renew``) runs every ``renew_every_s`` while the
        stream is relayed, from a timer task of its own: nothing is added per chunk but a count, and a stream whose
        chunks come minutes apart keeps its lease all the same. Renewals stop once the relay has read nothing from the
        engine for longer than the proxy timeout (the longest an engine may be silent): a client that keeps its
        connection but stops reading leaves the relay waiting in ``send`` for good, and its lease and running-slot
        hold (which count against the node's slots) must still run out, as they did before renewals. The task stops
        when the relay ends, however it ends.
        """
        usage: dict[str, Any] | None = None
        ttft_ms: float | None = None
        outcome = 499
        failed: GatewayError | None = None
        progress = [0]  # lines read from the engine: the renew timer renews only while it moves
        renewer = (asyncio.get_running_loop().create_task(
            _renew_every(renew, renew_every_s, progress, quiet_s=settings.QUIVER_PROXY_TIMEOUT_S))
                   if renew is not None and renew_every_s > 0 else None)
        try:
            async for line in upstream.aiter_lines():
                progress[0] += 1
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    outcome = upstream.status_code
                    record(outcome, usage, ttft_ms)
                    yield b"data: [DONE]\n\n"
                    continue
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if isinstance(chunk.get("error"), dict) and not chunk.get("choices"):
                    # The engine failed mid-stream (its own dialect: an integer code, its message): end with our
                    # error event in OpenAI's shape, metered with its status and the tokens sent.
                    code = chunk["error"].get("code")
                    failed = _engine_error(code if isinstance(code, int) and 400 <= code < 600 else 500, chunk,
                                           target)
                    outcome = failed.status
                    break
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if ttft_ms is None and chunk.get("choices"):
                    ttft_ms = (time.monotonic() - started) * 1000
                if not keep_usage:
                    if chunk.get("usage") and not chunk.get("choices"):
                        continue
                    chunk.pop("usage", None)
                elif chunk.get("choices"):
                    chunk["usage"] = None  # OpenAI sends usage only on the final chunk
                if "model" in chunk:
                    chunk["model"] = target.requested
                _strip_engine_fields(chunk)
                yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            if outcome == 499:  # the engine ended without [DONE]
                outcome = 502
        except UpstreamError as exc:
            logger.warning("gateway.stream_cut", extra={"error": repr(exc)})
            outcome = 502
        finally:
            if renewer is not None:
                renewer.cancel()
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            if outcome in (499, 502) or failed is not None:
                record(outcome, usage, ttft_ms)
        if failed is not None:
            yield b"data: " + json.dumps(failed.body()).encode() + b"\n\n"
        elif outcome == 502:
            error = {"error": {"message": "The inference node stopped mid-stream; the output is incomplete. Retry.",
                               "type": "server_error", "param": None, "code": "upstream_stream_cut"}}
            yield b"data: " + json.dumps(error).encode() + b"\n\n"


async def _renew_every(renew: Callable[[], Awaitable[None]], every_s: float, progress: list[int], *,
                       quiet_s: float) -> None:
    """Call ``renew`` every ``every_s`` seconds until cancelled (``renew`` never raises), while ``progress[0]`` (lines
    read from the engine) moved within the last ``quiet_s`` seconds, counted from the start."""
    seen, moved_at = 0, time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        if progress[0] != seen:
            seen, moved_at = progress[0], time.monotonic()
        elif time.monotonic() - moved_at > quiet_s:
            continue  # stuck longer than an engine may be silent (a client that stopped reading): let it run out
        await renew()


class _RecordedResponse(Response):
    """A JSON answer whose metering (``record``: metrics, usage row, limit settlement) runs once the body is sent,
    also when sending fails: it is off the client's latency (under a tenth of the gateway's CPU per 1-token
    completion, py-spy under ``scripts/bench_gateway``)."""

    def __init__(self, data: Any, *, headers: dict[str, str], record: Any) -> None:
        super().__init__(json.dumps(data, separators=(",", ":")), headers=headers, media_type="application/json")
        self._record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send, then meter."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._record()


class _RelayResponse(StreamingResponse):
    """A ``StreamingResponse`` whose end always runs ``cleanup``: Starlette cancels the body task when the client
    disconnects, and a relay cancelled before its first step (or while the task waits in ``send``) never reaches
    its own ``finally``."""

    def __init__(self, events: AsyncIterator[bytes], *, cleanup: Any, headers: dict[str, str]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream, then close the relay and free what it holds however the stream ended."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()


def relay_response(upstream: UpstreamResponse, *, target: TargetView, keep_usage: bool, record: Any, started: float,
                   headers: dict[str, str], renew: Callable[[], Awaitable[None]] | None = None,
                   renew_every_s: float = 0.0) -> StreamingResponse:
    """The SSE response relaying ``upstream`` (``GatewayApp._relay``); ``record`` (which releases the admission
    slot and settles the limits) runs exactly once: as the relay ends, or as 499 when the client left first.
    ``renew`` renews the concurrency lease every ``renew_every_s`` while the relay runs."""
    recorded = False

    def record_once(status: int, usage: dict[str, Any] | None, ttft_ms: float | None = None) -> None:
        nonlocal recorded
        if not recorded:
            recorded = True
            record(status, usage, ttft_ms)

    events = GatewayApp._relay(upstream, target=target, keep_usage=keep_usage, record=record_once, started=started,
                               renew=renew, renew_every_s=renew_every_s)

    async def cleanup() -> None:
        try:
            await events.aclose()  # runs the relay's finally now when it is suspended mid-stream
            await upstream.aclose()
        finally:
            record_once(499, None)

    return _RelayResponse(events, cleanup=cleanup,
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})


# vLLM-only response fields that say nothing to a tenant (or say how the platform is built).
ENGINE_FIELDS = ("kv_transfer_params", "ec_transfer_params", "metrics", "system_fingerprint")
# A JSON \\uD800-\\uDFFF escape: json.loads turns an unpaired one into a str that cannot be encoded as UTF-8, which
# failed later as a 500 (the database query for `model`, token estimates, the engine). Paired ones are fine.
LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """Raise 400 naming the first top-level field holding a string that is not valid Unicode (an unpaired UTF-16
    surrogate, from a ``\\ud800``-style escape)."""
    for name, value in body.items():
        try:
            json.dumps({name: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            field = name if name.encode("utf-8", "replace") == name.encode("utf-8", "surrogatepass") else "body"
            raise GatewayError(400, f"Invalid '{clip(field)}': it holds an unpaired UTF-16 surrogate (a \\ud800-\\udfff "
                               "escape without its pair), which is not text; send valid Unicode.",
                               code="invalid_value", param=field) from None


ENGINE_CHOICE_FIELDS = ("routed_experts", "prompt_logprobs", "prompt_token_ids", "token_ids", "stop_reason")


# Optional in OpenAI's schema but never null there; vLLM sends them as null (llm-comply's schema check, openai_chat.json).
NON_NULL_FIELDS = ("service_tier", "prompt_token_ids", "prompt_text")  # the last two: vLLM's, null unless asked
NON_NULL_USAGE_FIELDS = ("prompt_tokens_details", "completion_tokens_details")
NON_NULL_MESSAGE_FIELDS = ("annotations", "function_call", "audio")


def _drop_nulls(obj: Any, names: tuple[str, ...]) -> None:
    if isinstance(obj, dict):
        for name in names:
            if name in obj and obj[name] is None:
                del obj[name]


def _strip_engine_fields(data: dict[str, Any]) -> None:
    for name in ENGINE_FIELDS:
        data.pop(name, None)
    _drop_nulls(data, NON_NULL_FIELDS)
    _drop_nulls(data.get("usage"), NON_NULL_USAGE_FIELDS)
    for choice in data.get("choices") or []:
        if isinstance(choice, dict):
            for name in ENGINE_CHOICE_FIELDS:
                if choice.get(name) is None:
                    choice.pop(name, None)
            _drop_nulls(choice.get("message"), NON_NULL_MESSAGE_FIELDS)
            _drop_nulls(choice.get("delta"), NON_NULL_MESSAGE_FIELDS)


# The engine refusing the gateway's credentials (the node's key, its VLLM_API_KEY): the caller's key was fine.
ENGINE_AUTH_STATUSES = (401, 403)


def _engine_error(status: int, data: Any, target: TargetView, *, node_name: str | None = None,
                  endpoint: str = "completions") -> GatewayError:
    """An engine error in OpenAI's shape with our own message: no engine internals, no served names.

    A 401/403 from the engine means it refused the gateway's node key (a platform misconfiguration: a rotated
    ``VLLM_API_KEY``, a stale node key), never the caller's key, which the gateway already checked: it is a 502
    ``upstream_auth_failed`` (passing it on made a good key look revoked), logged at error for operators.
    """
    if status in ENGINE_AUTH_STATUSES:
        logger.error("gateway.engine_auth_refused", extra={
            "node": node_name, "status": status, "model": target.served_name,
            "detail": "the engine refused the node key: check the node's key against its engine's VLLM_API_KEY"})
        return GatewayError(502, "The inference node refused the platform's own credentials (a configuration fault "
                            "on our side, not your API key); retry, and contact the operator if it persists.",
                            code="upstream_auth_failed", type_="server_error")
    engine_message, engine_param = "", ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        engine_message = str(data["error"].get("message") or "")
        engine_param = str(data["error"].get("param") or "")
    try:
        limit = _context_error(engine_message, engine_param, target, endpoint) if status == 400 else None
    except ValueError:  # a figure past int()'s 4,300 digits (sys.get_int_max_str_digits): no engine's, and no 500
        limit = None
    if limit is not None:
        return limit
    context = re.search(r"maximum context length is (\d+)", engine_message)
    if status == 400 and (context or engine_param in ("input_tokens", "input_text")):
        size = f" of {context.group(1)} tokens" if context else ""
        return GatewayError(400, f"The prompt plus the requested completion exceeds the model's context{size}; "
                            "shorten the prompt or lower 'max_tokens'.", code="context_length_exceeded",
                            param="max_tokens")
    if status == 404:
        return GatewayError(404, f"The model `{target.requested}` is not available on the node right now; retry.",
                            code="model_not_available", type_="server_error", param="model")
    if 400 <= status < 500:
        param = None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raw_param = data["error"].get("param")
            # Only the top-level field: the rest is the engine's schema (`messages.0.ChatCompletion…Param.role`).
            field = raw_param.removeprefix("body.").split(".")[0] if isinstance(raw_param, str) else ""
            param = field if re.fullmatch(r"[a-z_]{1,40}", field) else None
        message = "The engine refused the request" + (f" (field '{param}')" if param else "") + \
            "; check the request's parameters against the model's limits."
        return GatewayError(400, message, code="invalid_request", param=param)
    return GatewayError(502, "The inference node failed to answer; retry.", code="upstream_error",
                        type_="server_error")


# vLLM's refusals of a request that cannot fit the model's context (vllm/renderers/params.py, TokenizeParams): a
# completion budget above the context itself (checked before the prompt is tokenized, so the prompt's length is not
# known), and a prompt that alone fills it (counted in tokens, or first bounded in characters). A completion that fits
# the context but not next to the prompt is no error there: it is shortened to what is left (get_max_tokens), and the
# choice's finish_reason says "length". Older vLLM refused that case with the prompt's count ("you requested ...").
_OUTPUT_OVER_CONTEXT = re.compile(r"\b(max_tokens|max_completion_tokens)=(\d+) cannot be greater than "
                                  r"max_model_len=(\d+)")
_SUM_OVER_CONTEXT = re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
                               r"\((\d+) in the messages, (\d+) in the completion\)")
_PROMPT_OVER_CONTEXT = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains "
                                  r"(at least )?(\d+) (input tokens|characters)")


def _context_error(engine_message: str, engine_param: str, target: TargetView,
                   endpoint: str) -> GatewayError | None:
    """The caller's own 400 for vLLM's context-length refusals, naming the field and the fix; None for other errors.

    Args:
        engine_message: the engine's ``error.message``.
        engine_param: the engine's ``error.param`` (``max_tokens``, ``max_completion_tokens``, ``input_tokens``,
            ``input_text``).
        target: the request's model (``requested`` names it in the message; served names never appear).
        endpoint: ``completions`` or ``chat/completions`` (``ROUTES``): which field holds the prompt.

    Returns:
        A 400 ``context_length_exceeded`` whose ``param`` is the field to change (``max_tokens`` or
        ``max_completion_tokens``; ``prompt`` or ``messages`` when the prompt alone is too long), or None.
    """
    model = f"model `{target.requested}`"
    if (output := _OUTPUT_OVER_CONTEXT.search(engine_message)) is not None:
        field, asked, context = output.group(1), int(output.group(2)), int(output.group(3))
        return GatewayError(
            400, f"Invalid '{field}': {asked} exceeds the context of {model}, {context} tokens; lower '{field}' to at "
            f"most {context} (a completion that does not fit beside the prompt stops early, finish_reason \"length\").",
            code="context_length_exceeded", param=field)
    if (total := _SUM_OVER_CONTEXT.search(engine_message)) is not None:
        field = engine_param if engine_param in ("max_tokens", "max_completion_tokens") else "max_tokens"
        context, prompt_tokens, asked = (int(g) for g in total.groups())
        room = context - prompt_tokens
        fix = f"lower '{field}' to at most {room}" if room > 0 else "shorten the prompt"
        return GatewayError(
            400, f"Invalid '{field}': {asked} exceeds the context of {model}, {context} tokens, minus the prompt's "
            f"{prompt_tokens}; {fix}.", code="context_length_exceeded", param=field if room > 0 else None)
    prompt = _PROMPT_OVER_CONTEXT.search(engine_message)
    if prompt is not None or engine_param in ("input_tokens", "input_text"):
        field = "messages" if endpoint == "chat/completions" else "prompt"
        if prompt is not None:
            unit = "tokens" if prompt.group(4) == "input tokens" else "characters"
            count = f"{prompt.group(2) or ''}{prompt.group(3)} {unit}"
            size = f"{count}, more than the context of {model}, {prompt.group(1)} tokens, holds"
        else:
            size = f"more than the context of {model} holds"
        return GatewayError(400, f"Invalid '{field}': the prompt is {size}, with no room left for a completion; "
                            f"shorten '{field}'.", code="context_length_exceeded", param=field)
    return None


application = GatewayApp()
