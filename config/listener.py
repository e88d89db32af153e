"""Two listeners, one Django project: the public one (``config.asgi``) and the internal one (``config.internal_asgi``).

The internal listener serves node heartbeats (``/internal/v1/*``) and the Django admin from ``config.internal_urls``
on its own port (8001 in docker-compose and Kubernetes), which no proxy, ingress or published port exposes. The
public listener has no route to either: a tenant cannot even reach them to try a key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase

LISTENER_KEY = "quiver_listener"
INTERNAL = "internal"
INTERNAL_URLCONF = "config.internal_urls"


class InternalListener:
    """ASGI wrapper marking every request of this server as internal (clients cannot set ASGI scope keys).

    Args:
        app: Django's ASGI handler.
    """

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Tag the scope and pass it on."""
        await self.app({**scope, LISTENER_KEY: INTERNAL}, receive, send)


class ListenerUrlconfMiddleware:
    """Django middleware: requests of the internal listener resolve against ``config.internal_urls``.

    Args:
        get_response: the next handler.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        """Pick the URL map from the listener the request came through."""
        scope = getattr(request, "scope", None)
        if isinstance(scope, dict) and scope.get(LISTENER_KEY) == INTERNAL:
            request.urlconf = INTERNAL_URLCONF
        return self.get_response(request)
