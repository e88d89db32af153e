"""A streamed request whose client leaves at any moment (before the first chunk, mid-stream, during a lease renewal,
or never; each moment an event the test drives, with the relay's clock in the test's hands) frees its running-slot hold and its concurrency lease exactly once, is metered once, and leaves no renew
timer behind; a stream that runs to the end renews its lease on the timer while it runs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from inference.gateway import exchange as gateway_exchange
from inference.gateway import relay as gateway_relay
from inference.gateway.app import GatewayApp
from inference.gateway.snapshot import NodeView
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.engine_stream import EngineStream

NODE = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)
CHUNKS, GAP_S = 8, 0.02


def _stream(first_s: float) -> EngineStream:
    """The engine's SSE answer: ``CHUNKS`` chunks ``GAP_S`` apart (after ``first_s``), with running usage."""
    return EngineStream([{"choices": [{"index": 0, "text": "x"}], "model": "m",
                          "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}} for i in range(CHUNKS)],
                        first_s=first_s, gap_s=GAP_S)


def _streaming_app(monkeypatch: pytest.MonkeyPatch, key: str,
                   stream: Callable[[], EngineStream]) -> tuple[GatewayApp, dict[str, Any], bytes]:
    """An in-process gateway whose engine answers each request with ``stream()`` on ``NODE``; the ASGI scope and body
    of a streamed completion with ``key``."""
    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> EngineStream:
        return stream()

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    async def engine_abort(engine_url: str, *, node_key: str, request_ids: list[str]) -> bool:
        return False  # an engine without the abort route: the relay counts what it received

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(gateway_exchange, "engine_abort", engine_abort)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    body = json.dumps({"model": "tiny-llama", "prompt": "x", "max_tokens": 8, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
             "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80), "scheme": "http", "root_path": ""}
    return GatewayApp(background=False), scope, body


class _Clock:
    """The relay's clock, driven by the test (``inference.gateway.relay``'s ``asyncio.sleep`` and ``time.monotonic``
    only): the renew timer wakes when :meth:`advance` says so, never by the machine's speed. Each ``advance`` moves
    the time one renew period and waits for that renewal to finish."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self.wake = asyncio.Event()
        self.renewed = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await self.wake.wait()
        self.wake.clear()

    async def advance(self) -> None:
        self.now += 0.02
        self.wake.set()
        await asyncio.wait_for(self.renewed.wait(), 30)  # a safety net, not a timing: it comes at once or never
        self.renewed.clear()


class _Shim:
    """A module stand-in: ``sleep``/``monotonic`` from the clock, everything else from ``real``."""

    def __init__(self, real: Any, **overrides: Any) -> None:
        self._real, self._overrides = real, overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides[name] if name in self._overrides else getattr(self._real, name)


class _DrivenStream(EngineStream):
    """The engine's SSE answer, one chunk per renew period of :class:`_Clock`; where ``leave`` is a moment of the
    stream, the client leaves there and the engine says nothing more."""

    def __init__(self, clock: _Clock, leave: str, gone: asyncio.Event) -> None:
        super().__init__([])
        self.clock, self.leave, self.gone = clock, leave, gone

    async def aiter_lines(self) -> AsyncIterator[str]:
        for i in range(CHUNKS):
            if (self.leave, i) in (("before_first_chunk", 0), ("mid_stream", 3)):
                self.gone.set()
                await asyncio.Event().wait()  # silent until the relay gives up on the gone client
            await self.clock.advance()
            yield "data: " + json.dumps({"choices": [{"index": 0, "text": "x"}], "model": "m",
                                         "usage": {"prompt_tokens": 1, "completion_tokens": i + 1}})
            yield ""
        yield "data: [DONE]"


@pytest.mark.django_db
@pytest.mark.parametrize("leave", ["before_first_chunk", "mid_stream", "during_renewal", "never"])
def test_a_client_leaving_at_any_moment_frees_the_hold_and_lease_once(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, settings: Any, leave: str) -> None:
    """The moments are events of the exchange, not delays: a loaded machine cannot move one across another. The
    proxy timeout is long (30 s), so neither the hold nor the lease can run out by themselves during the test: the
    second round is admitted only if the first released its lease."""
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 30.0, 0.0
    tenant = TenantFactory(concurrency_limit=1)  # the second round is refused unless the first freed its lease
    _, key = api_key_create(tenant, name="app")
    streams: list[EngineStream] = []
    box: dict[str, Any] = {}

    def stream() -> EngineStream:
        streams.append(_DrivenStream(box["clock"], leave, box["gone"]))
        return streams[-1]

    app, scope, body = _streaming_app(monkeypatch, key, stream)

    async def go() -> tuple[list[int], int]:
        clock = box["clock"] = _Clock()
        monkeypatch.setattr(gateway_relay, "asyncio", _Shim(asyncio, sleep=clock.sleep))
        monkeypatch.setattr(gateway_relay, "time", _Shim(time, monotonic=clock.monotonic))
        app._ensure_started()
        emitted: list[dict[str, Any]] = []
        renewals: list[int] = []
        monkeypatch.setattr(app.sink, "emit", emitted.append)
        limiter_renew = app.limiter.renew

        async def renew(admission: Any) -> None:
            renewals.append(1)
            if leave == "during_renewal" and len(renewals) % CHUNKS == 2:
                box["gone"].set()
                await asyncio.Event().wait()  # the client leaves while this renewal is in flight
            await limiter_renew(admission)
            clock.renewed.set()

        monkeypatch.setattr(app.limiter, "renew", renew)
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        for round_ in range(2):
            sent.clear()
            box["gone"] = asyncio.Event()
            received = 0

            async def receive() -> dict[str, Any]:
                nonlocal received
                received += 1
                if received == 1:
                    return {"type": "http.request", "body": body, "more_body": False}
                await box["gone"].wait()
                return {"type": "http.disconnect"}

            await app(scope, receive, send)
            assert next(m for m in sent if m["type"] == "http.response.start")["status"] == 200, (round_, sent)
            timers = [t for t in asyncio.all_tasks() if "_renew_every" in repr(t.get_coro())]
            if timers:  # cancelled by the relay's end; an uncancelled one would wait for the clock for ever
                done, _ = await asyncio.wait(timers, timeout=30)
                assert len(done) == len(timers) and all(t.cancelled() for t in timers), "the renew timer lived on"
            assert not app.admission._held  # the running-slot hold is freed
            assert len(emitted) == round_ + 1  # metered once
            assert all(s.closed for s in streams)
        return [row["status_code"] for row in emitted], len(renewals)

    statuses, renewals = async_to_sync(go)()
    assert statuses == ([200, 200] if leave == "never" else [499, 499])
    if leave == "never":
        assert renewals == 2 * CHUNKS  # one renewal per period of each stream, on its own timer


@pytest.mark.django_db
def test_a_client_that_stops_reading_stops_renewing_its_lease(monkeypatch: pytest.MonkeyPatch, base_model: Any,
                                                              settings: Any) -> None:
    """A client that keeps its connection open but reads nothing (the relay waits in ``send`` for good) must not keep
    its concurrency lease and running-slot hold alive for ever on the renew timer: renewals stop once nothing was
    read from the engine for longer than the proxy timeout, and the hold and lease run out as they did before
    renewals (the node's slots were otherwise held by streams the engine had long finished)."""
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 0.06, 0.0  # a lease renewed every 20 ms
    _, key = api_key_create(TenantFactory(concurrency_limit=1), name="app")

    app, scope, body = _streaming_app(monkeypatch, key, lambda: _stream(0.0))

    async def go() -> int:
        app._ensure_started()
        renewals: list[int] = []
        limiter_renew = app.limiter.renew

        async def renew(admission: Any) -> None:
            renewals.append(1)
            await limiter_renew(admission)

        monkeypatch.setattr(app.limiter, "renew", renew)
        requests = [{"type": "http.request", "body": body, "more_body": False}]
        bodies = 0

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await asyncio.sleep(3600)  # connected for good
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            nonlocal bodies
            if message["type"] == "http.response.body":
                bodies += 1
                if bodies > 1:
                    await asyncio.sleep(3600)  # the client's window is full: it reads no more

        relay = asyncio.create_task(app(scope, receive, send))
        await asyncio.sleep(0.3)  # 15 renewal periods with the relay stuck in send
        stuck = len(renewals)
        await asyncio.sleep(0.2)
        assert len(renewals) == stuck, "renewals went on while the stream made no progress"
        app.admission._sweep()
        assert not app.admission._held  # the hold ran out and was swept
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)
        return stuck

    async_to_sync(go)()


@pytest.mark.django_db
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_client_leaving_while_its_request_waits_for_a_node_frees_its_lease_at_once(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, settings: Any, stream: bool) -> None:
    """Attack round: a request waiting for a warm (``node_for``) held its concurrency lease until the wait ended, up
    to QUIVER_WARM_WAIT_S after its client had gone (59.5 s of 429s for a key limited to 1 in flight). Now the wait
    is cancelled when the client leaves, the lease is settled, and the next request is admitted at once."""
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 30.0, 60.0
    tenant = TenantFactory(concurrency_limit=1)
    _, key = api_key_create(tenant, name="app")
    app, scope, body = _streaming_app(monkeypatch, key, lambda: _stream(0.0))
    if not stream:
        body = body.replace(b'"stream": true', b'"stream": false')
    waiting, cancelled = asyncio.Event(), []

    async def node_for_a_warm(self: GatewayApp, target: Any) -> NodeView:
        waiting.set()
        try:
            await asyncio.sleep(3600)  # a warm that never finishes within the test
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return NODE

    async def go() -> tuple[int, int, list[dict[str, Any]]]:
        app._ensure_started()
        emitted: list[dict[str, Any]] = []
        monkeypatch.setattr(app.sink, "emit", emitted.append)
        monkeypatch.setattr(GatewayApp, "node_for", node_for_a_warm)
        gone = asyncio.Event()
        first: list[dict[str, Any]] = []

        async def receive_then_leave() -> dict[str, Any]:
            if not first:
                first.append({})
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any, into: list[dict[str, Any]] = first) -> None:
            into.append(message)

        request = asyncio.ensure_future(app(scope, receive_then_leave, send))
        await asyncio.wait_for(waiting.wait(), 30)
        gone.set()
        await asyncio.wait_for(request, 30)  # ends promptly, not after the 60 s warm wait
        status = next(m for m in first if m.get("type") == "http.response.start")["status"]

        monkeypatch.setattr(GatewayApp, "node_for", lambda self, target: _node())
        second: list[dict[str, Any]] = []
        received: list[int] = []

        async def receive_once() -> dict[str, Any]:
            received.append(1)
            if len(received) == 1:
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        async def send_second(message: Any) -> None:
            second.append(message)

        await asyncio.wait_for(app(scope, receive_once, send_second), 30)
        return status, next(m for m in second if m["type"] == "http.response.start")["status"], emitted

    async def _node() -> NodeView:
        return NODE

    first_status, second_status, emitted = async_to_sync(go)()
    assert cancelled == [True]  # the wait for the node was cut
    assert first_status == 499
    assert second_status == 200  # the lease of the request that left was freed: limit 1 admits the next at once
    assert [row["status_code"] for row in emitted] == [200]  # nothing ran for the one that left: no usage row
    assert not app.admission._held


def test_a_relay_cut_by_its_client_bills_what_the_engine_already_sent() -> None:
    """Whole-suite run: an n = 8 stream cut early was billed 40 completion tokens of the engine's 139; the rest sat
    unread in the gateway's receive buffer when the client left. The relay now tallies those lines before closing."""
    from inference.gateway.answers import UsageTally

    def event(done: int) -> str:
        return "data: " + json.dumps({"choices": [{"index": 0, "text": "x"}], "model": "m",
                                      "usage": {"prompt_tokens": 3, "completion_tokens": done}})

    class Buffered(EngineStream):
        async def aiter_lines(self) -> AsyncIterator[str]:
            yield event(1)
            yield ""
            await asyncio.Event().wait()  # the engine's next lines have arrived, but the relay is cut before it reads

        def buffered_lines(self) -> list[str]:
            return ['tokens": 2}}', "", event(5), "", event(9), "", "data: [DONE]"]  # a half line first

    recorded: list[tuple[int, Any]] = []

    async def go() -> None:
        upstream = Buffered([])
        target = type("Target", (), {"requested": "m", "served_name": "m"})()
        response = gateway_relay.relay_response(upstream, target=target, keep_usage=False,  # type: ignore[arg-type]
                                                record=lambda status, usage, ttft=None: recorded.append((status, usage)),
                                                started=time.monotonic(), headers={}, tally=UsageTally())
        sent: list[dict[str, Any]] = []
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message.get("body", b"").startswith(b"data:"):
                gone.set()  # the client leaves after its first event

        await asyncio.wait_for(response({"type": "http"}, receive, send), 30)
        assert upstream.closed

    asyncio.run(go())
    assert recorded == [(499, {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12})]
