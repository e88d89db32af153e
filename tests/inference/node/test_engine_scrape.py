"""The agent's load scrape client (``inference.node.engine_scrape``) against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from inference.node.engine_client import EngineError
from inference.node.engine_scrape import EngineScraper
from inference.node.load_publisher import scan_load

BODY = (Path(__file__).parent / "data" / "metrics_inflight.txt").read_text()


def _app(seen: list[dict[str, str]], status: int = 200, delay_s: float = 0.0) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        await asyncio.sleep(delay_s)
        return web.Response(text=BODY, status=status, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def test_scrapes_the_body_with_the_node_key_over_one_kept_connection() -> None:
    seen: list[dict[str, str]] = []

    async def run() -> list[str]:
        async with TestServer(_app(seen)) as server, EngineScraper(str(server.make_url("/")), "node-key") as scraper:
            return [await scraper.metrics_text() for _ in range(3)]

    bodies = asyncio.run(run())
    assert bodies == [BODY] * 3
    assert scan_load(bodies[0], at_s=1.0).num_requests_running == scan_load(BODY, at_s=1.0).num_requests_running
    assert [h["Authorization"] for h in seen] == ["Bearer node-key"] * 3
    assert all(h.get("Connection", "keep-alive").lower() == "keep-alive" for h in seen)


def test_an_engine_error_status_is_passed_on() -> None:
    async def run() -> None:
        async with TestServer(_app([], status=500)) as server, EngineScraper(str(server.make_url("/")), "k") as s:
            await s.metrics_text()

    with pytest.raises(EngineError) as caught:
        asyncio.run(run())
    assert (caught.value.status, caught.value.code) == (500, "engine_error")


def test_unreachable_and_slow_engines_are_503_engine_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def unreachable() -> None:
        async with EngineScraper(f"http://127.0.0.1:{port}", "k") as scraper:
            await scraper.metrics_text()

    async def slow() -> None:
        async with TestServer(_app([], delay_s=5.0)) as server, \
                EngineScraper(str(server.make_url("/")), "k", timeout_s=0.2) as scraper:
            await scraper.metrics_text()

    for attempt in (unreachable, slow):
        with pytest.raises(EngineError) as caught:
            asyncio.run(attempt())
        assert (caught.value.status, caught.value.code) == (503, "engine_unavailable")


def test_outside_its_context_it_refuses() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        asyncio.run(EngineScraper("http://127.0.0.1:1", "k").metrics_text())
