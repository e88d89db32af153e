"""Django's ASGI handler with its middleware chain run synchronously: one thread hop per request instead of ~13.

Under ASGI Django builds an async chain: every ``MiddlewareMixin`` middleware (all of Django's own) then runs each
``process_request``/``process_response`` through ``sync_to_async``, and the sync view through one more, so a request
crosses between the event loop and a thread about 13 times. Measured with py-spy on the web process
(``scripts/bench_upload``): those hops were most of a trivial request's CPU (``/healthz`` 5.7 → 2.3 ms here).
Quiver's control-plane views are all sync; the latency-sensitive OpenAI routes are served before Django
(``inference.gateway.app``). So the chain is built as under WSGI and entered once through ``sync_to_async``; an
async view (``/v1/models``) still runs on the server's event loop, through ``async_to_sync`` (Django's own path for
async views under WSGI).
"""

from __future__ import annotations

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class SyncChainASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose middleware chain and views run in the request's one thread (see the module doc)."""

    def load_middleware(self, is_async: bool = False) -> None:
        """Build the chain in sync mode, then make it awaitable as ``ASGIHandler.get_response_async`` expects."""
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)  # type: ignore[has-type]


def get_asgi_application() -> SyncChainASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``: set Django up, return the handler."""
    django.setup(set_prefix=False)
    return SyncChainASGIHandler()
