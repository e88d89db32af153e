"""The ASGI handler's middleware chain runs synchronously (config.sync_handler), and async views still answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.test import override_settings

from config.sync_handler import SyncChainASGIHandler
from tests.asgi_call import asgi_call, http_scope

MODES: list[str] = []


class Probe:
    """Middleware that can run either way; records the way Django chose (``"async"`` when handed a coroutine)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.mode = "async" if iscoroutinefunction(get_response) else "sync"

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        MODES.append(self.mode)
        return self.get_response(request)  # type: ignore[no-any-return]


def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if not messages:
            await asyncio.sleep(3600)  # the client stays connected; Django cancels this once it has answered
        return messages.pop()

    return asgi_call(app, http_scope("GET", path, headers), receive)


def test_every_middleware_runs_in_sync_mode() -> None:
    # Django's own ASGIHandler would run a middleware able to do both in async mode (a thread hop per hook).
    probe = f"{__name__}.Probe"
    MODES.clear()
    with override_settings(MIDDLEWARE=[probe, *settings.MIDDLEWARE, probe]):
        status, body = _get(SyncChainASGIHandler(), "/healthz")
    assert (status, body) == (200, {"ok": True})
    assert MODES == ["sync", "sync"]


@pytest.mark.django_db
def test_an_async_view_still_answers_through_the_sync_chain() -> None:
    # /v1/models is an async Django view: it runs on the event loop through async_to_sync.
    status, body = _get(SyncChainASGIHandler(), "/v1/models", {"authorization": "Bearer qv_nope.nope"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body
