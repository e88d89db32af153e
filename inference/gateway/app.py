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
import random
import time
from collections.abc import Awaitable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from common import auth_hints
from common.echo import clip
from inference.fleet.warming import warm_for_request
from inference.gateway import hygiene, metrics
from inference.gateway.admission import AdmissionGate
from inference.gateway.bus import subscribe_forever
from inference.gateway.directory import Directory, db_call
from inference.gateway.errors import GatewayError, error_response
from inference.gateway.exchange import Call, Exchange, meter_refusal, route_log
from inference.gateway.guard import host_allowed, request_host
from inference.gateway.limits import (
    RateLimiter,
    limits_mode_log,
    prompt_token_estimates,
)
from inference.gateway.limits import Scope as LimitScope
from inference.gateway.prompt_counter import INLINE_MAX_CHARS, PromptCounter
from inference.gateway.prompt_counts import Counted, prompt_counts
from inference.gateway.relay import ClientGone, client_gone_response, unless_client_gone, while_client_waits
from inference.gateway.snapshot import FleetView, KeyView, Limits, NodeView, RuleView, TargetView, node_choose
from inference.gateway.upstream import upstream_close
from inference.gateway.usage_sink import UsageSink
from inference.policy.routing import RouteConfig

logger = logging.getLogger(__name__)
ROUTES = {"/v1/completions": "completions", "/v1/chat/completions": "chat/completions"}
POLL_S = 0.2
# While a request waits for its adapter's warm, it asks for the warm again this often (seconds).
REWARM_S = 2.0
# A request waiting for a warm on the plan's home goes to a node that came to serve the version meanwhile after this
# long (seconds). A move while another node already serves it does not wait at all (GatewayApp._move).
MOVE_WAIT_S = 5.0
# A request that finds no live node re-reads the fleet first unless the view is this fresh (seconds): a node that
# just came live serves at once, and a flood of requests for a base model without nodes costs one read per interval.
NO_NODE_REREAD_S = 0.1
INFERENCE_SCOPE = "inference"
# Longest `model` looked up: served names are `<tenant>--<adapter>--<pk>` (slugs of at most 40), base model names
# are Hugging Face-style ids (at most 96 on the Hub).
MODEL_MAX_CHARS = 256
VERIFIED_MAX = 10_000


def _touch_last_used(key_pk: int) -> None:
    from tenants.models import ApiKey

    now = timezone.now()
    interval = timedelta(seconds=settings.QUIVER_API_KEY_LAST_USED_INTERVAL_S)
    ApiKey.objects.filter(pk=key_pk).exclude(last_used_at__gt=now - interval).update(last_used_at=now)


# What a request without max_tokens may generate: vLLM's completions default, and a budget for chat. Under a TPM
# limit it is also sent as max_tokens, so the tokens reserved bound the tokens billed.
DEFAULT_COMPLETION_RESERVE = {"completions": 16, "chat/completions": 256}


def _scopes(key: KeyView, target: TargetView | None = None) -> list[LimitScope]:
    scopes = [LimitScope(f"tenant:{key.tenant_id}", f"tenant {key.tenant_slug}", key.tenant_limits),
              LimitScope(f"key:{key.pk}", f"API key {key.key_id}", key.key_limits)]
    if target is not None and target.adapter_id is not None and target.adapter_limits != Limits():
        name = target.requested.partition("@")[0]
        scopes.append(LimitScope(f"adapter:{target.adapter_id}", f"adapter {name}", target.adapter_limits))
    return scopes


def _completion_budget(upstream: dict[str, Any], endpoint: str) -> int:
    """Completion tokens to hold on admission (with the estimated prompt): the completion budget × ``n`` × the
    prompts."""
    budget = hygiene.requested_tokens(upstream)
    if budget is None:
        budget = DEFAULT_COMPLETION_RESERVE[endpoint] * int(upstream.get("n", 1)) * hygiene.prompt_count(upstream)
    return budget


def _caps(key: KeyView) -> hygiene.Caps:
    tenant_cap, key_cap = key.tenant_limits.max_tokens, key.key_limits.max_tokens
    caps = [c for c in (tenant_cap, key_cap) if c is not None]
    # A tenant-wide cap was blamed on the key, which had none (a fresh user's finding).
    by = "key" if key_cap is not None and (tenant_cap is None or key_cap <= tenant_cap) else "tenant"
    return hygiene.Caps(max_tokens=min(caps) if caps else None, max_tokens_by=by, n=settings.QUIVER_GATEWAY_MAX_N,
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
        self.prompt_counter = PromptCounter()
        self._counting: dict[int, asyncio.Lock] = {}  # tenant id -> its turn to count a long prompt
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
        self.prompt_counter = PromptCounter()  # its loads are tasks of this loop
        self._counting = {}
        if self.background:
            self._tasks = [loop.create_task(subscribe_forever(self.directory)),
                           loop.create_task(self.sink.run_forever()),
                           loop.create_task(self.admission.run_forever()),
                           loop.create_task(self.limiter.keep_alive_forever())]

    async def shutdown(self) -> None:
        """Finish the requests' own tasks (settles, metering: :meth:`settled`), flush usage, stop background tasks,
        close the upstream pool (whatever failed before it: a SIGTERM'd process left its session unclosed)."""
        try:
            await self.settled(timeout=5.0)
            await self.sink.flushed(timeout=5.0)
            for task in self._tasks:
                task.cancel()
        finally:
            await upstream_close()

    async def settled(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: no bound) for the tasks requests spawned so far (token settles, a
        chat metered once its template sized it) to end; their usage rows are then in ``sink``."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

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
        host = request_host(scope)
        if not host_allowed(host, tuple(settings.ALLOWED_HOSTS), settings.DEBUG):
            # As Django answers it for every other route of this process (config.error_views.bad_request).
            response = error_response(GatewayError(
                400, f"Host '{clip(host)}' is not served here; use the address this service is published under, or "
                     "ask an operator to add it to DJANGO_ALLOWED_HOSTS.", code="disallowed_host"))
        elif endpoint is None:
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
            raise GatewayError(401, auth_hints.missing_key(),
                               code="invalid_api_key", type_="authentication_error")
        invalid = GatewayError(401, auth_hints.invalid_key(), code="invalid_api_key",
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

    async def resolve(self, key: KeyView, model: str, user: str | None = None) -> TargetView:
        """``model`` → what it reaches: a base model, ``name@N`` (that ready version), or ``name`` (the adapter's
        serving rule; a weighted split is chosen by :meth:`RuleView.pick`, sticky per OpenAI ``user``).

        Raises:
            GatewayError: 404 ``model_not_found`` (unknown, another tenant's, not in this key's scope: one answer;
                ``name@N`` of an own adapter without that ready version says so), 409 ``adapter_not_ready``.
        """
        rule = await self.directory.targets.get(key.tenant_id, model) if key.may_call(model) else "not_found"
        if not isinstance(rule, RuleView):
            if rule == "version_not_found":  # the tenant's own adapter: naming the wrong part leaks nothing
                name, _, n = (clip(part) for part in model.partition("@"))
                raise GatewayError(404, f"Adapter `{name}` has no ready version {n}; GET /api/v1/adapters/{name}/"
                                   f"versions lists them, and `{name}` calls the one it serves.",
                                   code="model_not_found", param="model")
            if rule == "not_ready":
                raise GatewayError(409, f"Adapter `{model}` has no ready version: wait if one is being validated, "
                                   "or upload a new one if it was rejected (its report says why).",
                                   code="adapter_not_ready", param="model")
            raise GatewayError(404, key.not_found_message(clip(model)), code="model_not_found", param="model")
        return rule.pick(user=user if isinstance(user, str) else None, draw=random.random())  # noqa: S311 (a split)

    async def node_for(self, target: TargetView, *, prefer: NodeView | None = None) -> NodeView:
        """A node ready to serve ``target``, warming a cold adapter with a bounded wait; ``prefer`` (the node that
        counted its prompt) while it is live and serves it.

        Raises:
            GatewayError: 503 ``no_capacity`` (no live node), ``adapter_load_failed`` or ``adapter_warm_timeout``.
        """
        fleet = self._routable(await self.directory.fleet())
        node = None if prefer is None else next((n for n in fleet.nodes if n.pk == prefer.pk), None)
        if node is None or (target.version_id is not None and not fleet.serves(node.pk, target.version_id)):
            node = node_choose(fleet, target, **self._policy())
        if node is None:  # the view may predate a node that just came live: one fresh read before a 503
            fleet = self._routable(await self.directory.fleet_fresh(NO_NODE_REREAD_S))
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
        route_log.info("gateway.warm", extra={"version_id": target.version_id, "node_pk": warm_node,
                                              "t": round(time.time(), 4)})
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

    def _node_for_call(self, call: Call) -> Awaitable[NodeView]:
        """:meth:`node_for` for ``call``, taking the node that counted its prompt first (``Call.serve_on_once``)."""
        prefer = call.serve_on_once()
        return self.node_for(call.target) if prefer is None else self.node_for(call.target, prefer=prefer)

    def _move(self, version_id: int, node_pk: int) -> None:
        """Ask, in the background, for ``version_id`` to be warmed on node ``node_pk`` (its new home), at most once per
        ``REWARM_S`` per (version, node) in this process (``placement_request_warm`` also drops duplicates)."""
        now = time.monotonic()
        if self._moves.get((version_id, node_pk), 0.0) > now:
            return
        if len(self._moves) >= VERIFIED_MAX:
            self._moves = {k: until for k, until in self._moves.items() if until > now}
        self._moves[version_id, node_pk] = now + REWARM_S
        route_log.info("gateway.move", extra={"version_id": version_id, "node_pk": node_pk, "t": round(time.time(), 4)})
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
        if hygiene.LONE_SURROGATE_ESCAPE.search(raw):
            hygiene.refuse_lone_surrogates(body)
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
        """One completion request, in stages: :meth:`_prepare` (key, body, model, token limits), the KV-pressure
        admission that picks the node (``AdmissionGate.acquire``), then an :class:`~inference.gateway.exchange.Exchange` with the engine
        (reroutes, the answer relayed and metered)."""
        started = time.monotonic()
        arrived = time.time()
        try:
            call = await self._prepare(request, endpoint)
        except GatewayError as exc:
            if exc.status == 429:
                metrics.RATE_LIMITED.labels(exc.type).inc()
            meter_refusal(self.sink, exc, endpoint=endpoint, started=started, arrived=arrived)
            return error_response(exc)
        key, target = call.key, call.target
        acquired: list[tuple[NodeView, Any]] = []

        async def acquire() -> tuple[NodeView, Any]:
            # KV-pressure admission (inference.gateway.admission): at once unless every eligible node is saturated.
            got = await self.admission.acquire(tenant=str(key.tenant_id), priority=key.priority,
                                               prompt_tokens=call.prompt_estimate,
                                               completion_tokens=call.completion_estimate,
                                               choose=lambda: self._node_for_call(call),
                                               lora=target.served_name if target.version_id is not None else None)
            acquired.append(got)
            return got

        try:
            # A client that leaves while its request waits (a warm, a saturated node) frees its concurrency lease and
            # token reservation at once, not when the wait ends (up to QUIVER_WARM_WAIT_S later).
            node, slot = await while_client_waits(request.receive, acquire())
        except GatewayError as exc:
            await self.limiter.settle(call.admission, actual_tokens=0)
            exc.metered = (key, target.requested, target)
            meter_refusal(self.sink, exc, endpoint=endpoint, started=started, arrived=arrived)
            return error_response(exc)
        except ClientGone:
            if acquired:
                self.admission.release(acquired[0][1])
            await self.limiter.settle(call.admission, actual_tokens=0)
            return client_gone_response(request)
        exchange = Exchange(self, call, node=node, slot=slot, started=started, arrived=arrived)
        if exchange.stream:
            return await exchange.proxy()
        # A JSON answer is only sent at the end: a client that leaves before it must not keep the engine
        # generating (and its concurrency slot held) for nothing. Its request is cut and metered 499.
        return await unless_client_gone(request, exchange.proxy(),
                                       gone=lambda: exchange.record(499, exchange.tally.usage()))

    async def _prepare(self, request: Request, endpoint: str) -> Call:
        """Stage 1: the key, the body (hygiene), the model's target and the token limits' reservation.

        Raises:
            GatewayError: 401/400/404/413/429, each in OpenAI's shape.
        """
        # The key before the body: the front door lets this path's bodies up to QUIVER_MAX_JSON_BYTES on the
        # word of any Authorization header, so junk credentials must not get a byte read (the cap still
        # answers 413 for a good key's oversized body).
        key = await self.authenticate(request)
        seen: list[Any] = [key, "", None]  # what a refusal's usage row names (meter_refusal): key, model, target
        try:
            return await self._prepare_body(request, endpoint, key, seen)
        except GatewayError as exc:
            exc.metered = tuple(seen)
            raise

    async def _prepare_body(self, request: Request, endpoint: str, key: KeyView, seen: list[Any]) -> Call:
        raw = await self._read_raw(request)
        body = self._parse(raw)
        seen[1] = body["model"]
        upstream = hygiene.upstream_body(body, endpoint=endpoint, caps=_caps(key),
                                         salt=hygiene.cache_salt(key.tenant_id, settings.SECRET_KEY))
        target = seen[2] = await self.resolve(key, body["model"], body.get("user"))
        scopes = _scopes(key, target)
        if hygiene.requested_tokens(upstream) is None and any(s.limits.tpm is not None for s in scopes):
            # Under a TPM limit the reservation must bound what the engine generates: without max_tokens vLLM
            # runs to the end of the context (a chat reserved 256 tokens and was billed 509, twice over 600).
            # At least min_tokens, which vLLM refuses above max_tokens.
            upstream["max_tokens"] = max(DEFAULT_COMPLETION_RESERVE[endpoint], upstream.get("min_tokens") or 0)
        # After hygiene and the model's lookup: a malformed body or unknown model gets its 400/404 before a
        # request too large for a TPM limit gets its (non-retryable) 429.
        # Estimated once: a body's tools are serialised for it, tens of ms on the event loop for a 4 MB one.
        # Under a TPM limit the prompt counts as the engine tokenizes it (one /tokenize call per prompt, on the
        # tenant's own critical path only); otherwise an estimate does (admission's fair-share cost, the fallback
        # bill of a prompt cut before its first chunk).
        tpm = any(s.limits.tpm is not None for s in scopes)
        if not tpm:
            counted = Counted(prompt_token_estimates(upstream))
        elif len(raw) <= INLINE_MAX_CHARS:
            counted = await self._prompt_counts(upstream, target)
        else:
            # One long count at a time per tenant in this process: eight parallel loops of 100,000-character prompts
            # under TPM 1,000 (every one a 429, none billed) kept a tokenizer busy for every tenant (attack round).
            async with self._counting.setdefault(key.tenant_id, asyncio.Lock()):
                counted = await self._prompt_counts(upstream, target)
        prompt_counts = counted.counts
        prompt_estimate = sum(prompt_counts)
        completion_estimate = _completion_budget(upstream, endpoint)
        admission = await self.limiter.admit(
            scopes, reserve=prompt_estimate + completion_estimate, prompt_tokens=prompt_estimate,
            length_field="max_completion_tokens" if "max_completion_tokens" in upstream else "max_tokens")
        return Call(key=key, target=target, endpoint=endpoint, upstream=upstream, admission=admission,
                    prompt_estimate=prompt_estimate, completion_estimate=completion_estimate,
                    prompt_counts=tuple(prompt_counts), serve_on=counted.node, count_check=counted.check)

    async def _prompt_counts(self, upstream: dict[str, Any], target: TargetView) -> Counted:
        """Each prompt's token count (:func:`~inference.gateway.prompt_counts.prompt_counts`: here, else on the node
        the request will be sent to first, :meth:`_count_node`)."""
        return await prompt_counts(upstream, target, counter=self.prompt_counter,
                                   serving_node=lambda: self._count_node(target),
                                   max_chars=settings.QUIVER_GATEWAY_TOKENIZE_MAX_CHARS)

    async def _count_node(self, target: TargetView) -> NodeView | None:
        """The node routing picks for ``target`` now when it serves it (the request then goes there first:
        ``Call.serve_on``), else None (a cold adapter: its count is bounded, sent to no node)."""
        fleet = self._routable(await self.directory.fleet())
        node = node_choose(fleet, target, **self._policy())
        serves = node is not None and (target.version_id is None or fleet.serves(node.pk, target.version_id))
        return node if serves else None

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


application = GatewayApp()

