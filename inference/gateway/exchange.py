"""Stage 3 of a completion request: the exchange with the engine on the node admission chose.

The body is sent; a node that refuses connections is skipped and one that no longer serves the adapter is recorded
(``inference.fleet.warming.placement_mark_not_served``) and routed around; the answer is relayed
(``inference.gateway.relay``) and metered exactly once.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from django.conf import settings
from starlette.responses import Response

from inference.fleet.warming import placement_mark_not_served
from inference.gateway import hygiene, metrics
from inference.gateway.admission import AdmissionGate
from inference.gateway.answers import (
    ENGINE_AUTH_STATUSES,
    UsageTally,
    assemble_answer,
    engine_error,
    engine_error_code,
    sse_event,
    strip_engine_fields,
)
from inference.gateway.directory import Directory, db_call
from inference.gateway.errors import GatewayError, error_response
from inference.gateway.limits import CHAT_TEMPLATE_ROOM, RateLimiter, has_non_text_part
from inference.gateway.prompt_counter import PromptCounter
from inference.gateway.prompt_counts import counts_check
from inference.gateway.relay import RecordedResponse, bill_cut, relay_response
from inference.gateway.snapshot import KeyView, NodeView, TargetView
from inference.gateway.upstream import (
    UpstreamError,
    UpstreamRefused,
    UpstreamResponse,
    engine_abort,
    engine_answers,
    upstream_post,
)
from inference.gateway.usage_sink import UsageSink
from inference.metering.usage import usage_row

logger = logging.getLogger(__name__)
# One line per request sent to a node (INFO, off unless ``QUIVER_GATEWAY_ROUTE_LOG=INFO``): scripts/bench_fleet
# reads it to record the live routing decision of every request beside what the simulator decides for it.
route_log = logging.getLogger("inference.gateway.route")
# Engine 404s for an adapter the fleet view said was served, answered by routing again (each bounded by the warm wait).
MAX_REROUTES = 3


class Gateway(Protocol):
    """What an exchange uses of the gateway app (``inference.gateway.app.GatewayApp``)."""

    admission: AdmissionGate
    limiter: RateLimiter
    prompt_counter: PromptCounter
    sink: UsageSink
    directory: Directory
    _down: dict[int, float]

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    def node_for(self, target: TargetView) -> Awaitable[NodeView]:
        """The node for ``target`` (routing, or a warm and a wait); raises ``GatewayError``."""
        ...


# A usage count past int4 made PostgreSQL refuse the usage row, which the drain drops: the request went unbilled.
MAX_USAGE_COUNT = 2**31 - 1


def usage_bounded(usage: dict[str, Any] | None, upstream: dict[str, Any], *, body_bytes: int,
                  prompt_bytes: int | None = None) -> dict[str, Any] | None:
    """The engine's ``usage`` with each count at most what the request can have cost, so an engine that lies (a
    host holding a node key, answering as its node) cannot bill a tenant, or fill its TPM window, past its request.

    Completion tokens are at most the budget the engine honours (``max_completion_tokens``/``max_tokens`` × ``n`` ×
    the prompts, ``hygiene.requested_tokens``) when the request sets one; prompt tokens at most the larger of the
    upstream body's bytes and ``prompt_bytes``, plus ``limits.CHAT_TEMPLATE_ROOM`` (never below the real count for
    text and token ids: a token covers at least one byte, a token id at least two of the JSON), unless a chat
    carries a part other than text (an image's tokens are not bounded by its URL's bytes); both at most
    :data:`MAX_USAGE_COUNT`. A node's engine billed a ``max_tokens`` 3 request 900,000,000 tokens each way (attack
    round).

    Args:
        usage: ``{"prompt_tokens", "completion_tokens", ...}`` as the engine reported it, or None.
        upstream: the body sent to the engine.
        body_bytes: its length as sent, in bytes.
        prompt_bytes: for a chat, the size in bytes of the prompt its chat template renders
            (``PromptCounter.chat_bytes``), when known: a template can write more than the request holds (tool
            definitions as indented JSON, a long system preamble: 412 tokens for a 313-byte chat on the suite's tiny
            model), and an honest engine's count of that was cut to the body's bytes. None: the body's alone.

    Returns:
        ``usage`` itself when no count was over (or it is empty/None); else a copy with ``prompt_tokens``,
        ``completion_tokens`` and ``total_tokens`` bounded (a count that is not a non-negative integer counts 0).
        Never raises.
    """
    if not usage:
        return usage
    reported = _usage_count(usage.get("prompt_tokens")), _usage_count(usage.get("completion_tokens"))
    prompt, completion = reported
    budget = hygiene.requested_tokens(upstream)
    if budget is not None:
        completion = min(completion, budget)
    if not has_non_text_part(upstream):
        prompt = min(prompt, max(body_bytes, prompt_bytes or 0) + CHAT_TEMPLATE_ROOM)
    prompt, completion = min(prompt, MAX_USAGE_COUNT), min(completion, MAX_USAGE_COUNT)
    if (prompt, completion) == reported:
        return usage
    logger.warning("gateway.engine_usage_bounded", extra={
        "reported_prompt": str(usage.get("prompt_tokens"))[:40], "reported_completion":
        str(usage.get("completion_tokens"))[:40], "prompt_tokens": prompt, "completion_tokens": completion})
    return {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def prompt_past_body(usage: dict[str, Any] | None, upstream: dict[str, Any], *, body_bytes: int) -> bool:
    """Whether a chat's reported prompt count passes what its body's bytes bound (``body_bytes`` plus
    ``limits.CHAT_TEMPLATE_ROOM``), so that only the size of its rendered template (``usage_bounded``'s
    ``prompt_bytes``) tells an honest count from an inflated one. False for a completion (no template) and for a
    chat with a part other than text (not bounded at all). One comparison: what every request pays for the cap."""
    if not usage or "messages" not in upstream:
        return False
    return _usage_count(usage.get("prompt_tokens")) > body_bytes + CHAT_TEMPLATE_ROOM and not has_non_text_part(upstream)


def _usage_count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(slots=True)
class Call:
    """A request after stage 1: who calls (``key``), what for (``target``), the body the engine will see, and the
    token limits' reservation (``admission``, None without limits) with the estimates it was made from."""

    key: KeyView
    target: TargetView
    endpoint: str
    upstream: dict[str, Any]
    admission: Any
    prompt_estimate: int
    completion_estimate: int
    prompt_counts: tuple[int, ...] = ()
    serve_on: NodeView | None = None  # the node whose engine counted the prompts: the request goes there first
    count_check: str = ""  # prompt_counts.Counted.check: compare the counts with the serving engine's at the end

    def serve_on_once(self) -> NodeView | None:
        """:attr:`serve_on`, once: the first node choice takes it (the prompt went to no other node); a later one
        (that node was saturated) routes as any request does."""
        node, self.serve_on = self.serve_on, None
        return node


class Exchange:
    """Stage 3 of a request: one exchange with the engine on the node admission chose, rerouted while the node
    refuses connections or no longer serves the adapter, and metered exactly once (:meth:`record`)."""

    def __init__(self, app: Gateway, call: Call, *, node: NodeView, slot: Any, started: float,
                 arrived: float) -> None:
        self.app, self.call, self.node, self.slot = app, call, node, slot
        self.started, self.arrived = started, arrived
        self.upstream = call.upstream
        self.limit_headers = call.admission.headers if call.admission else {}
        self.upstream["model"] = call.target.served_name
        engine_priority = app.admission.engine_priority(node, call.key.priority)
        if engine_priority is not None:
            self.upstream["priority"] = engine_priority
        self.stream = bool(self.upstream.get("stream"))
        if self.stream:
            interval = app.admission.engine_stream_interval(node, str(call.key.tenant_id))
            if interval is not None:
                self.upstream["stream_interval"] = interval
        client_options = self.upstream.get("stream_options") or {}
        self.keep_usage = bool(client_options.get("include_usage"))
        # Always a stream from the engine, with running counts per choice on every chunk: a request cut anywhere,
        # streamed or not, is billed what the engine generated for each choice (UsageTally); a client that asked
        # for one JSON answer gets it assembled here (answers.assemble_answer).
        self.upstream["stream"] = True
        self.upstream["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        self.tally = UsageTally(n=int(self.upstream.get("n") or 1), prompt_tokens=call.prompt_counts)
        self.content = json.dumps(self.upstream).encode()
        self.engine_request_id = uuid.uuid4().hex  # X-Request-Id: the engine names the request after it

    async def abort(self) -> bool:
        """Ask the engine serving this request to stop it (the client left); True when it took the ids. vLLM names
        a completion's prompt ``i`` ``cmpl-<X-Request-Id>-<i>`` and a chat request ``chatcmpl-<X-Request-Id>``
        (``vllm/entrypoints/openai/completion/serving.py``, ``chat_completion/serving.py``)."""
        rid = self.engine_request_id
        if self.call.endpoint == "chat/completions":
            ids = [f"chatcmpl-{rid}"]
        else:
            prompt = self.upstream.get("prompt")
            many = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
            ids = [f"cmpl-{rid}-{i}" for i in range(len(prompt) if many else 1)]  # type: ignore[arg-type]
        return await engine_abort(self.node.engine_url, node_key=self.node.key, request_ids=ids[:256])

    def record(self, status: int, usage: dict[str, Any] | None, ttft_ms: float | None = None) -> None:
        """Meter the request once it ended with ``status``: free its admission slot, settle its token reservation
        with ``usage`` (the engine's counts, bounded by ``usage_bounded``), count it and emit its usage row.

        A chat whose reported prompt passes its body's bound (``prompt_past_body``: a template that writes tools or
        a long preamble, or a lying engine) is metered a moment later, in a task, once the base model's chat
        template has sized its prompt (``PromptCounter.chat_bytes``: one render, no tokenizer); every other request
        is metered here and now."""
        self.app.admission.release(self.slot)
        latency_s = time.monotonic() - self.started
        body_bytes = len(self.content)
        if prompt_past_body(usage, self.upstream, body_bytes=body_bytes):
            self.app._spawn(self._meter_sized(status, usage, ttft_ms, latency_s))
            return
        self._meter(status, usage_bounded(usage, self.upstream, body_bytes=body_bytes), ttft_ms, latency_s)

    async def _meter_sized(self, status: int, usage: dict[str, Any] | None, ttft_ms: float | None,
                           latency_s: float) -> None:
        """:meth:`record`'s rare path: size the chat's rendered prompt, then meter with that bound (the body's alone
        when it cannot be sized, or when the task is cancelled first: the row is emitted either way)."""
        size = None
        try:
            size = await self.app.prompt_counter.chat_bytes(
                self.call.target.base_model_id, self.upstream.get("messages"), self.upstream.get("tools"),
                size=len(self.content))
        except Exception as exc:  # noqa: BLE001 - sizing must never lose the request's row
            logger.warning("gateway.chat_size_failed", extra={"error": repr(exc)[:200]})
        finally:
            self._meter(status, usage_bounded(usage, self.upstream, body_bytes=len(self.content), prompt_bytes=size),
                        ttft_ms, latency_s)

    def _meter(self, status: int, usage: dict[str, Any] | None, ttft_ms: float | None, latency_s: float) -> None:
        """Settle the token reservation with ``usage`` (already bounded), count the request and emit its row."""
        app, call = self.app, self.call
        key, target = call.key, call.target
        counts_check(app.prompt_counter, target.base_model_id, check=call.count_check, local=call.prompt_counts,
                     engine=self.tally.prompts, node=self.node.name)
        prompt_tokens = int((usage or {}).get("prompt_tokens") or 0)
        completion_tokens = int((usage or {}).get("completion_tokens") or 0)
        if call.admission is not None:
            app._spawn(app.limiter.settle(call.admission, actual_tokens=prompt_tokens + completion_tokens))
        app.admission.charge(str(key.tenant_id), prompt_tokens=prompt_tokens - call.prompt_estimate,
                              completion_tokens=completion_tokens - call.completion_estimate)
        metrics.request_observe(endpoint=call.endpoint, status=status, served_name=target.served_name,
                                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                latency_s=latency_s, ttft_s=None if ttft_ms is None else ttft_ms / 1000)
        app.sink.emit(usage_row(
            tenant_id=key.tenant_id, api_key_id=key.pk, adapter_version_id=target.version_id,
            base_model_id=target.base_model_id, node_id=self.node.pk, model_name=target.requested,
            version_number=target.version_number, endpoint=call.endpoint, stream=self.stream, status_code=status,
            usage=usage, latency_ms=latency_s * 1000, ttft_ms=ttft_ms, created_at=self.arrived))

    async def proxy(self) -> Response:
        """Stage 3 proper: send the body, reroute on a refused connection or an adapter the engine lost, and answer
        (a JSON body metered once sent, or the relayed stream)."""
        app, target, endpoint, record = self.app, self.call.target, self.call.endpoint, self.record
        node = self.node
        reroutes = 0
        metrics.TO_ENGINE.labels(endpoint).observe(time.monotonic() - self.started)
        try:
            while True:
                try:
                    response = await upstream_post(f"{node.engine_url}/v1/{endpoint}", content=self.content,
                                                   node_key=node.key, request_id=self.engine_request_id)
                except UpstreamError as exc:
                    # No response came. A refused connection reached no engine; a connection that broke before the
                    # answer (a kept-alive one to an engine that died) counts too when the engine's health check
                    # now gets no answer: the dead engine answers no one, so the request may go to another node.
                    # This process skips the node until heartbeats would have aged it out of routing everywhere.
                    refused = isinstance(exc, UpstreamRefused)
                    if not refused and await engine_answers(node.engine_url):
                        raise
                    logger.warning("gateway.upstream_refused", extra={"node": node.name, "error": repr(exc)})
                    app._down[node.pk] = time.monotonic() + settings.QUIVER_NODE_STALE_AFTER_S
                    try:
                        node = self.node = await app.node_for(target)
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
                    app.directory.invalidate("fleet")
                    try:
                        node = self.node = await app.node_for(target)
                    except GatewayError as exc:
                        record(exc.status, None)
                        return error_response(exc, target=target)
                    continue
                break
            if route_log.isEnabledFor(logging.INFO):
                self._log_route(reroutes)
        except UpstreamError as exc:
            logger.warning("gateway.upstream_unreachable %r", exc, extra={"node": node.name, "error": repr(exc)})
            record(502, None)
            return error_response(GatewayError(502, "The inference node did not answer; retry.",
                                               code="upstream_unreachable", type_="server_error"))
        except BaseException:  # cancelled (the client went away) before any answer: free the slot now
            app.admission.release(self.slot)
            raise
        if response.status_code >= 400 or not response.is_event_stream:
            try:
                raw = await response.aread()
            except UpstreamError as exc:
                logger.warning("gateway.upstream_failed", extra={"node": node.name, "error": repr(exc)})
                record(502, None)
                return error_response(GatewayError(502, "The inference node stopped answering; retry.",
                                                   code="upstream_failed", type_="server_error"))
            except BaseException:
                app.admission.release(self.slot)
                raise
            finally:
                await response.aclose()
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            if response.status_code >= 400 or not isinstance(data, dict):
                failed = engine_error(response.status_code, data, target, node_name=node.name,
                                       endpoint=endpoint)
                # An engine that refused the node's key is metered as what the caller got (502), not as a 401.
                status = failed.status if response.status_code in ENGINE_AUTH_STATUSES else response.status_code
                record(status if response.status_code >= 400 else 502, None)
                return error_response(failed)
            data["model"] = target.requested
            strip_engine_fields(data)
            if isinstance(data.get("usage"), dict):
                data["usage"] = await self.billed(data["usage"])
            app.admission.release(self.slot)
            return RecordedResponse(data, headers=self.limit_headers, record=lambda: record(200, data.get("usage")))
        # A stream can outlive its concurrency lease and its running-slot hold (the proxy timeout bounds each
        # read, not the stream): the relay renews both on a timer, a third of a lease apart, until it ends.
        async def renew() -> None:
            app.admission.renew(self.slot)
            if self.call.admission is not None and self.call.admission.holds_lease:
                await app.limiter.renew(self.call.admission)

        if not self.stream:
            return await self._collect(response)
        return relay_response(response, target=target, keep_usage=self.keep_usage, record=record, started=self.started,
                              tally=self.tally, abort=self.abort, billed=self.billed,
                              headers=self.limit_headers, renew=renew, renew_every_s=app.admission.hold_s() / 3)

    async def billed(self, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        """``usage`` as this request is billed (:func:`usage_bounded`, a chat past its body's bound sized by its
        rendered template as :meth:`_meter_sized` does): what the client's ``usage`` shows too, so an engine's claim
        is never echoed beside a smaller bill (issue 30). Idempotent; never raises."""
        body_bytes, size = len(self.content), None
        if prompt_past_body(usage, self.upstream, body_bytes=body_bytes):
            try:
                size = await self.app.prompt_counter.chat_bytes(
                    self.call.target.base_model_id, self.upstream.get("messages"), self.upstream.get("tools"),
                    size=body_bytes)
            except Exception as exc:  # noqa: BLE001 - the body's bound then
                logger.warning("gateway.chat_size_failed", extra={"error": repr(exc)[:200]})
        return usage_bounded(usage, self.upstream, body_bytes=body_bytes, prompt_bytes=size)

    def _log_route(self, reroutes: int) -> None:
        """Log where this request went: the engine's request id (vLLM's stream ``id`` is ``cmpl-<rid>``), the node,
        the version's tier there in the fleet view this process routed by (database words; ``cold`` when absent;
        ``?`` when no view is cached) and the engine 404s routed around before it."""
        version_id = self.call.target.version_id
        fleet = self.app.directory.fleet_seen()
        tier = "?" if fleet is None else next(
            (p.tier for p in fleet.placements.get(version_id or 0, ()) if p.node_id == self.node.pk), "cold")
        route_log.info("gateway.route", extra={"rid": self.engine_request_id, "node": self.node.name,
                                               "version_id": version_id, "tier": tier, "reroutes": reroutes,
                                               "t": round(time.time(), 4)})

    async def _collect(self, response: UpstreamResponse) -> Response:
        """A non-streaming client's answer: read the engine's stream to its end, tallying each chunk's counts, and
        answer the assembled JSON (metered once sent). An engine error event is answered in OpenAI's shape with its
        status, a cut stream as 502, each metered with the tokens the engine reported; a client that leaves first
        cancels this read (the engine aborts on the closed connection) and is metered 499 by the caller with
        ``self.tally``."""
        app, target = self.app, self.call.target
        chunks: list[dict[str, Any]] = []
        failed: GatewayError | None = None
        done = False
        try:
            async for line in response.aiter_lines():
                chunk = sse_event(line)
                if chunk is None:
                    continue
                if isinstance(chunk, str):  # DONE, the only text sse_event returns
                    done = True
                    continue
                code = engine_error_code(chunk)
                if code is not None:
                    failed = engine_error(code, chunk, target)
                    break
                self.tally.add(chunk)
                if chunk.get("choices"):
                    chunks.append(chunk)
        except UpstreamError as exc:
            logger.warning("gateway.upstream_failed", extra={"node": self.node.name, "error": repr(exc)})
            failed = GatewayError(502, "The inference node stopped answering; retry.", code="upstream_failed",
                                  type_="server_error")
        except BaseException:  # the client left (cancelled): stop the engine and count what it generated
            with anyio.CancelScope(shield=True):
                await bill_cut(response, self.tally, self.abort)
            app.admission.release(self.slot)
            raise
        finally:
            await response.aclose()
        if failed is None and not done:
            failed = GatewayError(502, "The inference node stopped mid-answer; retry.", code="upstream_stream_cut",
                                  type_="server_error")
        usage = await self.billed(self.tally.usage())
        if failed is not None:
            self.record(failed.status, usage)
            return error_response(failed)
        data = assemble_answer(self.call.endpoint, chunks, usage)
        data["model"] = target.requested
        strip_engine_fields(data)
        app.admission.release(self.slot)
        return RecordedResponse(data, headers=self.limit_headers, record=lambda: self.record(200, usage))


def meter_refusal(sink: UsageSink, exc: GatewayError, *, endpoint: str, started: float, arrived: float) -> None:
    """Meter a request the gateway refused before any engine (a 400, 404, 429, 503...) when its tenant is known
    (``exc.metered``: the key, the model as sent, the target or None), so a throttled tenant sees its 429s among its
    errors; bounded per tenant (``UsageSink.emit_refusal``). ``started`` is monotonic, ``arrived`` Unix seconds.

    The row names the model only once it was found (``target``): a name no model has, or one sent with a body refused
    before the lookup, is recorded as ``""``. Unique made-up names were each a row and a line of the tenant's and the
    operator's traffic tables (attack round: 496 names in 15 s); the 404's message tells the client which name."""
    if exc.metered is None:
        return
    key, model, target = exc.metered
    now = time.monotonic()
    found = isinstance(model, str) and target is not None
    sink.emit_refusal(usage_row(
        tenant_id=key.tenant_id, api_key_id=key.pk, adapter_version_id=target.version_id if target else None,
        base_model_id=target.base_model_id if target else None, node_id=None, model_name=model if found else "",
        version_number=target.version_number if target else None,
        endpoint=endpoint, stream=False, status_code=exc.status, usage=None, latency_ms=(now - started) * 1000,
        ttft_ms=None, created_at=arrived), now)
