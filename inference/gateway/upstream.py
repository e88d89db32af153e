"""The gateway process's one pooled HTTP client to the engines (keep-alive; pool size ``QUIVER_GATEWAY_UPSTREAM_POOL``).

A new ``httpx.AsyncClient`` per request cost about 45 ms here (it builds a TLS context each time) and a fresh TCP
connection each time (issue 7 "Why"). A pooled httpx client still cost about 1.8 ms of CPU per proxied 1-token
completion here (pure-Python h11 parsing, anyio layers, cookie handling: cProfile of the gateway under
``scripts/bench_gateway`` load), most of the request path's CPU; aiohttp's session with its C parser costs about
0.75 ms for the same exchange, so the engines are called through it. The session is bound to the event loop that
made it, so one is kept per loop, and closed with it: by the lifespan's shutdown (:func:`upstream_close`), else when
the loop's last tasks are cancelled as it ends (``asyncio.run``, uvicorn's exit, each ``async_to_sync`` call of an
in-process test): sessions left open were logged "Unclosed client session" at every test run's exit. Each node's own key (``inference.fleet.node_client.node_key``, its engine's
``VLLM_API_KEY``) goes on each request; tenants never hold it.

Errors: :class:`UpstreamRefused` when nothing reached the engine (safe to try another node), :class:`UpstreamError`
for everything else that breaks the exchange (a dropped connection, a timeout, a cut body).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from django.conf import settings

# Below uvicorn's (and so vLLM's) 5 s keep-alive timeout: reusing a connection the engine is closing fails the request.
UPSTREAM_KEEPALIVE_S = 4.0
CONNECT_TIMEOUT_S = 5.0
ABORT_TIMEOUT_S = 2.0
# Event loop id -> (that loop, its session, the task that closes the session when the loop ends). The loop is kept to
# tell a live loop from a later one given the same id.
_sessions: dict[int, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, asyncio.Task[None]]] = {}


class UpstreamError(Exception):
    """The exchange with the engine failed (connection dropped, timed out, body cut short)."""


class UpstreamRefused(UpstreamError):
    """The engine could not be reached at all (refused or timed-out connect): the request never left."""


class UpstreamResponse:
    """An engine's response, read once: ``status_code``, then :meth:`aread` or :meth:`aiter_lines`, then
    :meth:`aclose` (closes the connection unless the body was read to its end, so an abandoned stream stops the
    engine's work). Read errors raise :class:`UpstreamError`."""

    def __init__(self, raw: aiohttp.ClientResponse) -> None:
        self._raw = raw
        self.status_code = raw.status
        # Read but not yet taken, kept here rather than in one iterator: a relay cut mid-read drains the rest later.
        self._lines: deque[str] = deque()
        self._pending = b""

    @property
    def is_event_stream(self) -> bool:
        """Whether the engine answers with server-sent events (a stream), not one JSON body."""
        return self._raw.content_type == "text/event-stream"

    async def aread(self) -> bytes:
        """The whole body."""
        try:
            return await self._raw.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(repr(exc)) from exc

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines without their ``\\n`` / ``\\r\\n`` (any length; SSE events are lines). A later call goes on
        where an earlier one stopped (cancelled, or closed after a line), so no line is lost or read twice."""
        lines, content = self._lines, self._raw.content
        try:
            while True:
                while lines:
                    yield lines.popleft()
                chunk = await content.readany()
                if not chunk:
                    break
                self._pending += chunk
                if b"\n" in chunk:
                    *complete, self._pending = self._pending.split(b"\n")
                    lines.extend(line.rstrip(b"\r").decode("utf-8", "replace") for line in complete)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(repr(exc)) from exc
        if self._pending:
            pending, self._pending = self._pending, b""
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    def buffered_lines(self) -> list[str]:
        """Lines the engine already sent that nobody took yet, without waiting (empty when none, or when a read is in
        progress): those :meth:`aiter_lines` holds, then what the connection's buffer holds. A relay whose client
        left bills these when the engine could not be asked to stop (``engine_abort``): on a loaded gateway they can
        hold many of the tokens the engine generated (99 of 139 for an n = 8 stream in one whole-suite run)."""
        try:
            data = self._pending + self._raw.content.read_nowait()
        except (RuntimeError, aiohttp.ClientError):
            data = b""
        return [*self._lines, *(line.rstrip(b"\r").decode("utf-8", "replace") for line in data.split(b"\n"))]

    async def aclose(self) -> None:
        """Give the connection back (body fully read) or close it (body not finished)."""
        self._raw.release()


def upstream_session() -> aiohttp.ClientSession:
    """The pooled session of the running event loop (created on first use, closed when the loop ends: see the
    module's docstring). Call from a coroutine."""
    loop = asyncio.get_running_loop()
    held = _sessions.get(id(loop))
    if held is not None and held[0] is loop and not held[1].closed:
        return held[1]
    connector = aiohttp.TCPConnector(limit=settings.QUIVER_GATEWAY_UPSTREAM_POOL, limit_per_host=0,
                                     keepalive_timeout=UPSTREAM_KEEPALIVE_S)
    session = aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                      sock_read=settings.QUIVER_PROXY_TIMEOUT_S))
    guard = loop.create_task(_close_when_cancelled(session), name="quiver-upstream-session")
    _sessions[id(loop)] = (loop, session, guard)
    return session


async def _close_when_cancelled(session: aiohttp.ClientSession) -> None:
    """Wait until cancelled (the loop ending cancels its remaining tasks), then close ``session``."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        loop_id = id(asyncio.get_running_loop())
        held = _sessions.get(loop_id)
        if held is not None and held[1] is session:
            del _sessions[loop_id]
        await session.close()


async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> UpstreamResponse:
    """POST ``content`` (JSON) to an engine with the node's key; returns once the response headers are in.
    ``request_id`` goes as ``X-Request-Id``, which vLLM's OpenAI server names the request after
    (``OpenAIServing._base_request_id``), so that :func:`engine_abort` can stop it.

    Raises:
        UpstreamRefused: nothing reached the engine (connection refused, connect timeout).
        UpstreamError: the connection broke or timed out after the request may have reached it.
    """
    try:
        headers = upstream_headers(node_key)
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        raw = await upstream_session().post(url, data=content, headers=headers)
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise UpstreamRefused(repr(exc)) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamError(repr(exc)) from exc
    return UpstreamResponse(raw)


async def engine_abort(engine_url: str, *, node_key: str, request_ids: list[str]) -> bool:
    """Ask the engine to stop generating for ``request_ids`` (``POST /quiver/v1/abort``,
    ``inference.node.engine_ext.abort``); True when it took them. Its streams of them then end at once with the
    engine's final counts. Bounded by ``ABORT_TIMEOUT_S``; never raises (False: close the connection instead, and
    vLLM aborts when it notices)."""
    try:
        async with upstream_session().post(f"{engine_url}/quiver/v1/abort",
                                           data=json.dumps({"request_ids": request_ids}).encode(),
                                           headers=upstream_headers(node_key),
                                           timeout=aiohttp.ClientTimeout(total=ABORT_TIMEOUT_S)) as raw:
            return raw.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def engine_token_count(engine_url: str, *, node_key: str, body: dict[str, Any]) -> int | None:
    """The engine's own token count of a prompt (vLLM's ``POST /tokenize``: ``{"model", "prompt"}``, or
    ``{"model", "messages", "tools"?}`` with the chat template applied), or None when the engine did not answer
    with a count (the caller falls back to a bound). Bounded by the proxy timeout; never raises."""
    try:
        async with upstream_session().post(f"{engine_url}/tokenize", data=json.dumps(body).encode(),
                                           headers=upstream_headers(node_key)) as raw:
            if raw.status != 200:
                return None
            data = await raw.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    count = data.get("count") if isinstance(data, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


async def engine_answers(engine_url: str, *, timeout: float = 2.0) -> bool:
    """Whether the engine answers ``GET /health`` with 200 on a fresh connection within ``timeout`` s.

    A refused connect is not enough to call an engine gone: a killed vLLM's processes can take a second or more to
    exit (a multi-GB address space is torn down before the files are closed), and its listening socket, inherited by
    the engine's children, keeps accepting connections into the kernel's backlog that no one will read (scaleout test,
    CI of 2026-12-01). Only an HTTP answer says it is alive. Never raises.
    """
    parts = urlsplit(engine_url)
    secure = parts.scheme == "https"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or (443 if secure else 80), ssl=secure or None),
            timeout=timeout)
    except (OSError, TimeoutError, ValueError):
        return False
    try:
        writer.write(f"GET /health HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        status_line = await asyncio.wait_for(reader.readline(), timeout=timeout)
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        writer.close()
    return status_line.split(b" ", 2)[1:2] == [b"200"]


async def upstream_close() -> None:
    """Close the running loop's session now (lifespan shutdown); the next call opens a new one."""
    loop = asyncio.get_running_loop()
    held = _sessions.get(id(loop))
    if held is None or held[0] is not loop:
        return
    del _sessions[id(loop)]
    held[2].cancel()
    await held[1].close()


def upstream_headers(node_key: str) -> dict[str, str]:
    """Headers for an engine call: the node's key as bearer token, JSON body."""
    return {"Authorization": f"Bearer {node_key}", "Content-Type": "application/json"}
