"""Drive an ASGI application in-process the way Django's test client does, for tests of the ASGI layers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.core.signals import request_finished, request_started
from django.db import close_old_connections


def http_scope(method: str, path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An ASGI 3 ``http`` scope for ``method path`` from 127.0.0.1 with ``headers`` (names lower-cased)."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
            "raw_path": path.encode(), "query_string": b"", "scheme": "http", "server": ("testserver", 80),
            "client": ("127.0.0.1", 5000), "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}


def asgi_exchange(app: Any, scope: dict[str, Any],
                  receive: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[int, dict[str, str], bytes]:
    """Run ``app`` for one request; returns ``(status, response headers, body bytes)``.

    Django's ``close_old_connections`` signal handlers are detached meanwhile, as its test client does, so the
    handler does not close the test's database connection (inside the test's transaction).
    """
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(app)(scope, receive, send)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}, raw


def asgi_call(app: Any, scope: dict[str, Any],
              receive: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
    """:func:`asgi_exchange`, returning ``(status, JSON body or {})``."""
    status, _, raw = asgi_exchange(app, scope, receive)
    return status, json.loads(raw) if raw else {}
