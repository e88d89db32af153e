"""Slow clients are cut (config.request_timeouts), on the demo's own web command line (issue 30 point 7).

The attack round held 20 connections open for 60 s by trickling a byte every 2 s. Here the demo's ``web_argv``
runs with deadlines of 2 s (headers) and 2 s + 1 s per 500 bytes (body), and raw sockets trickle.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from demo.run import web_argv
from tests.fixtures.web_process import web_process

pytestmark = pytest.mark.django_db(transaction=True)

HEADER_S = 2.0
BODY_S = 2.0
MIN_RATE = 500
SLACK_S = 1.5  # scheduling on a loaded 2-core machine
TRICKLE_S = 0.5


@pytest.fixture(scope="module", params=["TimedHTTPProtocol", "TimedH11Protocol"])
def web(request: pytest.FixtureRequest, django_db_setup: None,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(host, port) of the demo's web process with short deadlines: as the demo runs it (httptools, uvicorn's
    ``auto`` choice here), then on h11 (what ``TimedHTTPProtocol`` is where httptools is not installed)."""
    argv = web_argv("config.asgi:application", 0)
    argv[argv.index("--port") + 1] = "{port}"
    assert argv[argv.index("--http") + 1] == "config.request_timeouts:TimedHTTPProtocol"
    argv[argv.index("--http") + 1] = f"config.request_timeouts:{request.param}"
    with web_process(argv, tmp_path_factory.mktemp("web-timeouts"), QUIVER_HEADER_TIMEOUT_S=str(HEADER_S),
                     QUIVER_BODY_TIMEOUT_S=str(BODY_S), QUIVER_BODY_MIN_RATE=str(MIN_RATE)) as url:
        parts = urlsplit(url)
        yield parts.hostname or "127.0.0.1", parts.port or 80


def _trickle(address: tuple[str, int], opening: bytes, drip: bytes, count: int, limit_s: float) -> list[
        tuple[float, bytes]]:
    """Open ``count`` connections, send ``opening`` on each, then one byte of ``drip`` per connection every
    ``TRICKLE_S`` until the server closes them (or ``limit_s`` passes). Returns, per connection, the seconds from
    its opening until the server ended it (``inf`` if it never did) and what it answered."""
    selector = selectors.DefaultSelector()
    started, answers, ended = {}, {}, {}
    for _ in range(count):
        sock = socket.create_connection(address, timeout=5)
        sock.setblocking(False)
        started[sock] = time.monotonic()
        answers[sock] = b""
        sock.sendall(opening)
        selector.register(sock, selectors.EVENT_READ)
    position = 0
    next_drip = time.monotonic() + TRICKLE_S
    deadline = time.monotonic() + limit_s
    while len(ended) < count and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.05):
            sock = key.fileobj
            try:
                chunk = sock.recv(4096)  # type: ignore[union-attr]
            except ConnectionResetError:
                chunk = b""
            answers[sock] += chunk  # type: ignore[index]
            if not chunk:
                ended[sock] = time.monotonic() - started[sock]  # type: ignore[index]
                selector.unregister(sock)
        if drip and time.monotonic() >= next_drip:
            byte = drip[position % len(drip):position % len(drip) + 1]
            position += 1
            next_drip += TRICKLE_S
            for sock in list(started):
                if sock not in ended:
                    try:
                        sock.send(byte)
                    except OSError:
                        pass
    result = [(ended.get(sock, float("inf")), answers[sock]) for sock in started]
    for sock in started:
        sock.close()
    return result


def test_twenty_connections_trickling_headers_are_cut_within_the_header_deadline(web: tuple[str, int]) -> None:
    opening = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
    results = _trickle(web, opening, b"X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n", 20, limit_s=15)
    for seconds, answer in results:
        assert seconds <= HEADER_S + SLACK_S, f"still open after {seconds:.1f} s: {answer[:80]!r}"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


def test_a_connection_that_sends_nothing_is_cut(web: tuple[str, int]) -> None:
    (seconds, answer), = _trickle(web, b"", b"", 1, limit_s=15)
    assert seconds <= HEADER_S + SLACK_S and answer.startswith(b"HTTP/1.1 408"), (seconds, answer[:80])


def test_a_trickled_body_is_cut_within_the_body_deadline(web: tuple[str, int]) -> None:
    opening = (b"POST /api/v1/auth/login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               b"Content-Length: 400\r\n\r\n{")
    results = _trickle(web, opening, b"a", 5, limit_s=15)
    bound = BODY_S + 400 / MIN_RATE + SLACK_S  # even had all 400 bytes come, the deadline could not pass this
    for seconds, answer in results:
        assert seconds <= bound, f"still open after {seconds:.1f} s: {answer[:80]!r}"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


def test_a_steady_body_past_the_base_deadline_is_served(web: tuple[str, int]) -> None:
    # 6,000 bytes at 1,500 B/s: 4 s, twice the base deadline, but above the minimum rate all along.
    body = b'{"username": "nobody", "password": "' + b"p" * 5_940 + b'"}'
    head = (f"POST /api/v1/auth/login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(web, timeout=15) as sock:
        sock.sendall(head)
        started = time.monotonic()
        for i in range(0, len(body), 150):
            sock.sendall(body[i:i + 150])
            time.sleep(0.1)  # the pacing under test, not a synchronisation wait
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert time.monotonic() - started > BODY_S + SLACK_S
    status = answer.split(b" ", 2)[1]
    assert status not in (b"408",) and status.startswith(b"4"), answer[:200]  # the API answered (CSRF/validation)


def test_keep_alive_requests_each_get_fresh_deadlines(web: tuple[str, int]) -> None:
    with socket.create_connection(web, timeout=10) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"ok": true}'):
                chunk = sock.recv(4096)
                assert chunk, f"closed after {answer!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
            time.sleep(HEADER_S + 0.5)  # idle past the header deadline: the next request still starts cleanly
