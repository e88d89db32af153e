"""The ``/v1/*`` catch-all: whatever breaks behind it, an OpenAI client gets OpenAI's ``{"error": {...}}`` in JSON.

An ASGI middleware (outermost in ``config.asgi``). On ``/v1/*`` paths:

- an exception raised before the response started becomes a JSON 500 ``internal_error`` (logged with its traceback;
  uvicorn would otherwise answer ``text/plain`` "Internal Server Error");
- a 5xx response that is not JSON or an event stream (Django's HTML error page, a plain-text error) is replaced by
  the JSON error of the same status, so no page, traceback or engine text reaches a tenant.

Other paths and scopes pass through untouched. An exception after a response started cannot change its status;
it is re-raised and the server closes the connection (a stream's client sees it cut).

Also here: the ``Host`` check of the gateway's own routes (:func:`host_allowed`, Django's rule without its request
cycle), used by ``inference.gateway.app``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from functools import lru_cache
from typing import Any

from django.http.request import split_domain_port, validate_host

logger = logging.getLogger(__name__)
Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]
PREFIX = "/v1/"
PASS_TYPES = (b"application/json", b"text/event-stream")


def error_body(status: int) -> bytes:
    """OpenAI's error object for an unexpected ``status`` (5xx): our own message, never the cause's text."""
    if status == 500:
        message, code = "The server hit an internal error; retry, and contact the operator if it persists.", \
            "internal_error"
    else:
        message, code = "The service is unavailable right now; retry shortly.", "service_unavailable"
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return json.dumps(body, separators=(",", ":")).encode()


async def _send_error(send: Callable[[Message], Awaitable[None]], status: int) -> None:
    raw = error_body(status)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


class OpenAIErrorGuard:
    """Wraps ``app`` so that nothing under ``/v1/`` answers a non-OpenAI-shaped 5xx (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        """Pass through, replacing exceptions and non-JSON 5xx on ``/v1/*`` with OpenAI-shaped errors."""
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        started = False
        replaced = False

        async def guarded_send(message: Message) -> None:
            nonlocal started, replaced
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
                ctype = next((v for k, v in message.get("headers", []) if k.lower() == b"content-type"), b"")
                if status >= 500 and not ctype.lower().startswith(PASS_TYPES):
                    replaced = True
                    await _send_error(send, status)
                    return
            elif replaced:
                return  # the original body of a replaced response is dropped
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except Exception:
            logger.exception("gateway.unhandled_error", extra={"path": scope.get("path"),
                                                               "method": scope.get("method")})
            if replaced:
                return  # the client already has its JSON error
            if started:
                raise
            await _send_error(send, 500)


def request_host(scope: MutableMapping[str, Any]) -> str:
    """The request's ``Host`` header (latin-1, as ASGI servers pass it), else the server's address."""
    for name, value in scope.get("headers") or ():
        if name == b"host":
            return str(value.decode("latin-1"))
    server = scope.get("server")
    return f"{server[0]}:{server[1]}" if server else ""


@lru_cache(maxsize=256)
def host_allowed(host: str, allowed: tuple[str, ...], debug: bool) -> bool:
    """Django's own ``ALLOWED_HOSTS`` rule (``HttpRequest.get_host``: ``validate_host``, and under ``DEBUG`` with an
    empty list, localhost only), for the routes this app serves without Django; memoised per host."""
    domain, _ = split_domain_port(host)
    if not allowed and debug:
        allowed = (".localhost", "127.0.0.1", "[::1]")
    return bool(domain) and validate_host(domain, list(allowed))
