"""Read timeouts for request headers and bodies: uvicorn's HTTP protocols with Apache ``mod_reqtimeout``'s deadlines.

uvicorn bounds only the idle time between keep-alive requests (``--timeout-keep-alive``): a client may take as long
as it likes to send a request's headers or body, one byte at a time. Twenty connections trickling a byte every 2 s
all stayed open for a minute against the demo stack (issue 30, point 7), each holding a socket and, once its
headers were in, a request in the application; enough of them exhaust file descriptors or the database pool
(slow-loris).

Here each connection gets the deadlines of Apache's ``mod_reqtimeout`` (defaults ``header=20-40,MinRate=500
body=20,MinRate=500``; https://httpd.apache.org/docs/2.4/mod/mod_reqtimeout.html):

- **headers**: the request line and headers must be complete within ``QUIVER_HEADER_TIMEOUT_S`` (20 s) of their first
  byte, or of the connection's opening for the first request; else ``408 Request Timeout`` and the connection closes;
- **body**: ``QUIVER_BODY_TIMEOUT_S`` (20 s) from the end of the headers, extended by one second per
  ``QUIVER_BODY_MIN_RATE`` bytes received (500): a client must keep sending at least that rate on average, which any
  real upload does, and a trickle does not. Time the server itself stops reading (flow control, while the application
  has not consumed what came) does not count against the client.

Use: ``uvicorn config.asgi:application --http config.request_timeouts:TimedHTTPProtocol`` (the demo, compose and
Kubernetes do). The variables are read once at import, in the server process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("quiver.http")

HEADER_TIMEOUT_S = float(os.environ.get("QUIVER_HEADER_TIMEOUT_S", "20"))
BODY_TIMEOUT_S = float(os.environ.get("QUIVER_BODY_TIMEOUT_S", "20"))
BODY_MIN_RATE = float(os.environ.get("QUIVER_BODY_MIN_RATE", "500"))

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: 36\r\n\r\nRequest not received in time; retry.")


class _Deadlines:
    """The deadline bookkeeping shared by both protocols (a mixin: ``loop``, ``transport``, ``flow``, ``client`` and
    ``cycle`` come from uvicorn's protocol classes)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: Any
    client: Any
    cycle: Any
    _timer: asyncio.TimerHandle | None = None
    _phase = "idle"
    _body_started = 0.0
    _body_bytes = 0

    def _arm_headers(self) -> None:
        self._phase = "headers"
        self._arm_at(time.monotonic() + HEADER_TIMEOUT_S)

    def _arm_body(self) -> None:
        self._phase = "body"
        self._body_started, self._body_bytes = time.monotonic(), 0
        self._arm_at(self._body_started + BODY_TIMEOUT_S)

    def _body_received(self, count: int) -> None:
        if self._phase != "body":
            return
        self._body_bytes += count
        self._arm_at(self._body_started + BODY_TIMEOUT_S + self._body_bytes / BODY_MIN_RATE)

    def _disarm(self, phase: str = "idle") -> None:
        self._phase = phase
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_at(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # call_later on the loop's clock; the deadline is on time.monotonic(), the same clock on CPython's loops.
        self._timer = self.loop.call_later(max(0.0, deadline - time.monotonic()), self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._phase not in ("headers", "body"):
            return
        if self._phase == "body" and getattr(self.flow, "read_paused", False):
            # The server stopped reading (the application has not consumed the body yet): not the client's delay.
            self._body_started = time.monotonic() - self._body_bytes / BODY_MIN_RATE
            self._arm_at(self._body_started + BODY_TIMEOUT_S + self._body_bytes / BODY_MIN_RATE)
            return
        cycle = getattr(self, "cycle", None)
        if self._phase == "headers":  # the cycle, if any, is the previous request's: is its answer still going out?
            answered = cycle is not None and not getattr(cycle, "response_complete", True)
        else:
            answered = cycle is not None and getattr(cycle, "response_started", False)
        logger.warning("http.request_timeout", extra={"phase": self._phase, "client": self.client,
                                                       "body_bytes": self._body_bytes})
        if not answered:
            self.transport.write(_408)
        self.transport.close()


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without httptools: h11 only
    HttpToolsProtocol = None  # type: ignore[assignment, misc]


if HttpToolsProtocol is not None:

    class TimedHttpToolsProtocol(_Deadlines, HttpToolsProtocol):  # type: ignore[misc, valid-type]
        """uvicorn's httptools protocol with the header and body deadlines of this module."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            """Open the connection; the first request's headers are due within ``HEADER_TIMEOUT_S``."""
            super().connection_made(transport)
            self._arm_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            """Drop the deadline with the connection."""
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            """A request's first byte: its headers are due within ``HEADER_TIMEOUT_S``."""
            super().on_message_begin()
            if self._phase != "headers":
                self._arm_headers()

        def on_headers_complete(self) -> None:
            """Headers in: the body deadline starts."""
            super().on_headers_complete()
            self._arm_body()

        def on_body(self, body: bytes) -> None:
            """Each body chunk pushes the deadline by ``len(body) / BODY_MIN_RATE`` seconds."""
            super().on_body(body)
            self._body_received(len(body))

        def on_message_complete(self) -> None:
            """The whole request is in: no deadline until the next one begins."""
            super().on_message_complete()
            self._disarm()


class TimedH11Protocol(_Deadlines, H11Protocol):
    """uvicorn's h11 protocol with the header and body deadlines of this module (h11's parser state tells the
    phase after each read)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Open the connection; the first request's headers are due within ``HEADER_TIMEOUT_S``."""
        super().connection_made(transport)
        self._arm_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed h11, then move the deadline to the phase the request is in."""
        before = self._phase
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:
            if before != "headers":
                self._arm_headers()
        elif state is h11.SEND_BODY:
            if before != "body":
                self._arm_body()
            else:
                self._body_received(len(data))
        else:  # DONE, MUST_CLOSE, CLOSED, ERROR: the request is in (or over)
            self._disarm()


TimedHTTPProtocol: type[asyncio.Protocol] = (
    TimedHttpToolsProtocol if HttpToolsProtocol is not None else TimedH11Protocol)  # type: ignore[has-type]
"""What ``--http auto`` would pick (httptools when installed, else h11), with the deadlines."""
