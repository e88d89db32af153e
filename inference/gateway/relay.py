"""Relaying the engine's answer to the client: the SSE stream with ``model`` renamed and usage metered as it goes,
a JSON answer metered once it is sent, and the lease renewals a long stream needs."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from django.conf import settings
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from inference.gateway.answers import (
    UsageTally,
    engine_error,
    engine_error_code,
    sse_event,
    strip_engine_fields,
)
from inference.gateway.errors import GatewayError, error_response
from inference.gateway.snapshot import TargetView
from inference.gateway.upstream import UpstreamError, UpstreamResponse

logger = logging.getLogger(__name__)
T = TypeVar("T")
Billed = Callable[[dict[str, Any] | None], Awaitable[dict[str, Any] | None]]  # a request's usage → its bill
# How long a cut request's stream is read after the engine was asked to abort it (one engine step, normally).
CUT_DRAIN_S = 5.0


async def relay_stream(upstream: UpstreamResponse, *, target: TargetView, keep_usage: bool, record: Any,
                       tally: UsageTally | None = None, abort: Callable[[], Awaitable[bool]] | None = None,
                       started: float, renew: Callable[[], Awaitable[None]] | None = None,
                       renew_every_s: float = 0.0, billed: Billed | None = None) -> AsyncGenerator[bytes, None]:
    """Relay the engine's SSE stream with ``model`` renamed; meter what was actually sent.

    Ends as: ``[DONE]`` relayed → the engine's status; the engine's stream cut → an OpenAI error event, 502;
    an engine error event → ours in its place, with the mapped status (``engine_error``); the client gone → 499. Tokens are the engine's own running counts, per choice (:class:`~inference.gateway.answers.UsageTally`,
    ``continuous_usage_stats``), so a stream cut anywhere is billed what the engine generated for every choice: when
    the client leaves, ``abort`` (the engine's abort of this request) stops the engine and the rest of its stream is
    read for its final counts (:func:`bill_cut`).

    ``renew`` (the concurrency lease's renewal, ``RateLimiter.renew``) runs every ``renew_every_s`` while the
    stream is relayed, from a timer task of its own: nothing is added per chunk but a count, and a stream whose
    chunks come minutes apart keeps its lease all the same. Renewals stop once the relay has read nothing from the
    engine for longer than the proxy timeout (the longest an engine may be silent): a client that keeps its
    connection but stops reading leaves the relay waiting in ``send`` for good, and its lease and running-slot
    hold (which count against the node's slots) must still run out, as they did before renewals. The task stops
    when the relay ends, however it ends.

    ``billed`` (``exchange.usage_bounded`` for this request) turns the tally's usage into what the request is billed:
    the final usage chunk a client asked for (``keep_usage``) carries that, not the engine's claim (an engine
    claiming 2,147,483,647 tokens was shown them while billed far fewer, issue 30).
    """
    tally = tally if tally is not None else UsageTally()
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
            chunk = sse_event(line)
            if chunk is None:
                continue
            if isinstance(chunk, str):  # DONE, the only text sse_event returns
                outcome = upstream.status_code
                record(outcome, tally.usage(), ttft_ms)
                yield b"data: [DONE]\n\n"
                continue
            code = engine_error_code(chunk)
            if code is not None:
                # The engine failed mid-stream (its own dialect: an integer code, its message): end with our
                # error event in OpenAI's shape, metered with its status and the tokens sent.
                failed = engine_error(code, chunk, target)
                outcome = failed.status
                break
            tally.add(chunk)
            if ttft_ms is None and chunk.get("choices"):
                ttft_ms = (time.monotonic() - started) * 1000
            if not keep_usage:
                if chunk.get("usage") and not chunk.get("choices"):
                    continue
                chunk.pop("usage", None)
            elif chunk.get("choices"):
                chunk["usage"] = None  # OpenAI sends usage only on the final chunk
            elif isinstance(chunk.get("usage"), dict) and billed is not None:
                chunk["usage"] = {**chunk["usage"], **((await billed(tally.usage())) or {})}
            if "model" in chunk:
                chunk["model"] = target.requested
            strip_engine_fields(chunk)
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
            if outcome == 499:  # the client left: what the engine generated until it stopped is billed all the same
                await bill_cut(upstream, tally, abort)
            await upstream.aclose()
        if outcome in (499, 502) or failed is not None:
            record(outcome, tally.usage(), ttft_ms)
    if failed is not None:
        yield b"data: " + json.dumps(failed.body()).encode() + b"\n\n"
    elif outcome == 502:
        error = {"error": {"message": "The inference node stopped mid-stream; the output is incomplete. Retry.",
                           "type": "server_error", "param": None, "code": "upstream_stream_cut"}}
        yield b"data: " + json.dumps(error).encode() + b"\n\n"


async def bill_cut(upstream: UpstreamResponse, tally: UsageTally, abort: Callable[[], Awaitable[bool]] | None) -> None:
    """Count into ``tally`` what the engine generated for a request whose client left: ask the engine to stop
    (``abort``, ``inference.gateway.upstream.engine_abort``), then read its stream to the end, whose final usage
    chunk holds the engine's totals (vLLM ends an aborted request's stream with them). Closing the connection alone
    lets the engine go on until it notices, and the tokens it generates meanwhile are never sent (40 of 81 for an
    n = 8 stream in one CI run). Without an abort, or past ``CUT_DRAIN_S``, what was already received is counted.
    Never raises but for cancellation."""
    if abort is not None and await abort():
        try:
            async with asyncio.timeout(CUT_DRAIN_S):
                async for line in upstream.aiter_lines():
                    _tally_line(line, tally)
            return
        except (TimeoutError, UpstreamError):
            pass
    for line in upstream.buffered_lines():
        _tally_line(line, tally)


def _tally_line(line: str, tally: UsageTally) -> None:
    """Count the running usage of ``line`` when it is a complete SSE event (``UsageTally.add``); anything else (a
    comment, a partial line, ``[DONE]``, an error event) is skipped."""
    chunk = sse_event(line)
    if isinstance(chunk, dict) and not isinstance(chunk.get("error"), dict):
        tally.add(chunk)


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


class RecordedResponse(Response):
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


class _RelayResponse(Response):
    """The relay's SSE response: each event sent as the relay yields it, and ``cleanup`` run however the stream ended.

    Not Starlette's ``StreamingResponse``: under uvicorn (ASGI spec 2.3) that runs every stream in an anyio task group
    (a task for the body, a cancel scope, a disconnect listener), the largest gateway cost on the streaming path under
    py-spy (``scripts/bench_gateway``, mixed adapters at concurrency 1). Here the body is sent from the request's own
    task, and one plain watcher task cancels it when the client disconnects, as ``unless_client_gone`` does for JSON
    answers: a relay waiting on the engine is cut at once (closing the engine connection, so vLLM aborts the
    request), and a relay cancelled before its first step never reaches its own ``finally``, hence ``cleanup``.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], *, cleanup: Any, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._events = events
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream, then close the relay and free what it holds however the stream ended."""
        try:
            await while_client_waits(receive, self._send_all(send))
        except (ClientGone, OSError):
            pass  # the client left, or its connection broke under a send: the relay is cut either way
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self._events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def relay_response(upstream: UpstreamResponse, *, target: TargetView, keep_usage: bool, record: Any, started: float,
                   tally: UsageTally | None = None, abort: Callable[[], Awaitable[bool]] | None = None,
                   headers: dict[str, str], renew: Callable[[], Awaitable[None]] | None = None,
                   renew_every_s: float = 0.0, billed: Billed | None = None) -> Response:
    """The SSE response relaying ``upstream`` (:func:`relay_stream`); ``record`` (which releases the admission
    slot and settles the limits) runs exactly once: as the relay ends, or as 499 when the client left first.
    ``renew`` renews the concurrency lease every ``renew_every_s`` while the relay runs."""
    recorded = False

    def record_once(status: int, usage: dict[str, Any] | None, ttft_ms: float | None = None) -> None:
        nonlocal recorded
        if not recorded:
            recorded = True
            record(status, usage, ttft_ms)

    tally = tally if tally is not None else UsageTally()
    events = relay_stream(upstream, target=target, keep_usage=keep_usage, record=record_once, started=started,
                          tally=tally, abort=abort, renew=renew, renew_every_s=renew_every_s, billed=billed)

    async def cleanup() -> None:
        try:
            await events.aclose()  # runs the relay's finally now when it is suspended mid-stream
            if not recorded:  # cut before the relay's first step: the engine has started all the same
                await bill_cut(upstream, tally, abort)
            await upstream.aclose()
        finally:
            record_once(499, tally.usage())

    return _RelayResponse(events, cleanup=cleanup,
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})


class ClientGone(Exception):
    """The client disconnected while its request waited (:func:`while_client_waits`)."""


async def while_client_waits(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first (``receive``, the ASGI channel, yields
    ``http.disconnect``): then cancel it and raise :class:`ClientGone`.

    One watcher task, which cancels this one: cheaper on the hot path than running ``work`` as a task of its own.
    The request's body must have been read (the watcher takes every later message).

    Raises:
        ClientGone: the client left before ``work`` ended (``work`` was cancelled, or its result is dropped when
            both happened at once: a caller that must undo a result keeps it itself).
    """
    current = asyncio.current_task()
    left: list[bool] = []

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
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
        raise ClientGone from None
    finally:
        watcher.cancel()


def client_gone_response(request: Request) -> Response:
    """The 499 answer (nobody reads it) for a client that left, logged once."""
    logger.info("gateway.client_gone", extra={"path": request.url.path})
    return error_response(GatewayError(499, "The client closed the request before the answer.",
                                       code="client_closed_request", type_="invalid_request_error"))


async def unless_client_gone(request: Request, work: Any, *, gone: Any) -> Response:
    """Await ``work`` (the engine exchange of a non-streaming request) unless the client disconnects first: then
    cancel it (closing the engine connection, so vLLM aborts the request), call ``gone()`` and answer 499."""
    try:
        return await while_client_waits(request.receive, work)
    except ClientGone:
        gone()
        return client_gone_response(request)
