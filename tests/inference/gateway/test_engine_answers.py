"""The gateway's liveness probe of an engine after a broken exchange: only an HTTP 200 on /health says alive.

A killed vLLM's last process can keep its listening socket (and so accept connections) for a second or more while it
exits; a TCP connect alone called it alive and the request got a 502 instead of going to another node (scaleout CI).
"""

from __future__ import annotations

import asyncio
import socket

from inference.gateway.upstream import engine_answers


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_a_listener_that_accepts_but_never_answers_is_not_alive() -> None:
    sock = _listener()  # the kernel completes the handshake into the backlog; nobody reads: a dying engine
    try:
        port = sock.getsockname()[1]
        assert asyncio.run(engine_answers(f"http://127.0.0.1:{port}", timeout=0.3)) is False
    finally:
        sock.close()


def test_a_closed_port_is_not_alive() -> None:
    sock = _listener()
    port = sock.getsockname()[1]
    sock.close()
    assert asyncio.run(engine_answers(f"http://127.0.0.1:{port}", timeout=0.3)) is False


async def _serve_once(status: bytes) -> bool:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readline())
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        alive = await engine_answers(f"http://127.0.0.1:{port}", timeout=2)
    assert seen == [b"GET /health HTTP/1.1\r\n"]
    return alive


def test_an_engine_answering_its_health_check_is_alive() -> None:
    assert asyncio.run(_serve_once(b"200 OK")) is True


def test_an_engine_answering_an_error_is_not_alive() -> None:
    assert asyncio.run(_serve_once(b"503 Service Unavailable")) is False
