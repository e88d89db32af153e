"""The gateway's pooled engine session (``inference.gateway.upstream``) ends with its event loop: closed by the
lifespan's shutdown, and otherwise when the loop ends (``asyncio.run``, an in-process test's ``async_to_sync``).
Sessions of ended loops stayed open and aiohttp logged "Unclosed client session" for each at every test run's exit.

A real HTTP server (aiohttp's, in the test's loop) stands in for the engine: only the client's life is under test.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from asgiref.sync import async_to_sync

from inference.gateway import upstream
from inference.gateway.app import GatewayApp
from inference.gateway.upstream import upstream_post, upstream_session


async def _engine(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _one_exchange() -> aiohttp.ClientSession:
    """POST once to a local server through the pooled session, reading the answer (its connection stays pooled, as
    the gateway's do); returns the session, left open as a request leaves it."""
    app = web.Application()
    app.router.add_post("/{tail:.*}", _engine)
    async with TestServer(app) as server:
        response = await upstream_post(str(server.make_url("/v1/completions")), content=b"{}", node_key="k")
        assert response.status_code == 200 and await response.aread() == b'{"ok": true}'
        await response.aclose()
        session = upstream_session()
        assert not session.closed  # still pooled for the loop's next request
        return session


@pytest.mark.parametrize("runner", ["asyncio.run", "async_to_sync"])
def test_a_loops_session_is_closed_when_the_loop_ends(runner: str) -> None:
    session = asyncio.run(_one_exchange()) if runner == "asyncio.run" else async_to_sync(_one_exchange)()
    assert session.closed
    assert all(held[1] is not session for held in upstream._sessions.values())


def test_each_loop_gets_its_own_session_and_a_closed_one_is_replaced() -> None:
    async def two() -> tuple[Any, Any, Any]:
        first = upstream_session()
        assert upstream_session() is first  # pooled within the loop
        await upstream.upstream_close()
        assert first.closed
        second = upstream_session()
        return first, second, second.closed

    first, second, open_then = asyncio.run(two())
    assert first is not second and open_then is False and second.closed
    third = asyncio.run(_one_exchange())
    assert third is not second and third.closed


def test_the_lifespan_shutdown_closes_the_session_even_when_the_flush_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway process on SIGTERM: uvicorn runs the lifespan's shutdown, whose usage flush can fail (Redis or the
    database gone); the engine session is closed all the same."""
    app = GatewayApp(background=False)

    async def failing_flush(timeout: float) -> None:
        raise ConnectionError("usage store gone")

    async def run() -> tuple[aiohttp.ClientSession, list[str], bool]:
        session = upstream_session()
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[str] = []

        async def receive() -> dict[str, str]:
            return next(messages)

        async def send(message: dict[str, str]) -> None:
            sent.append(message["type"])

        app._ensure_started()
        monkeypatch.setattr(app.sink, "flushed", failing_flush)
        with pytest.raises(ConnectionError):
            await app({"type": "lifespan"}, receive, send)
        return session, sent, session.closed

    session, sent, closed_in_loop = asyncio.run(run())
    assert sent == ["lifespan.startup.complete"]  # the failure is uvicorn's to report
    assert closed_in_loop, "closed by the shutdown itself, not only when the loop ended"
