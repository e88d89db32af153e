"""Django's ASGI handler with its middleware chain run synchronously: one thread hop per request instead of ~13.

Under ASGI Django builds an async chain: every ``MiddlewareMixin`` middleware (all of Django's own) then runs each
``process_request``/``process_response`` through ``sync_to_async``, and the sync view through one more, so a request
crosses between the event loop and a thread about 13 times. Measured with py-spy on the web process
(``scripts/bench_upload``): those hops were most of a trivial request's CPU (``/healthz`` 5.7 → 2.3 ms here).
Quiver's control-plane views are all sync; the latency-sensitive OpenAI routes are served before Django
(``inference.gateway.app``). So the chain is built as under WSGI and entered once through ``sync_to_async``; an
async view (``/v1/models``) still runs on the server's event loop, through ``async_to_sync`` (Django's own path for
async views under WSGI).

A sync streaming response (whitenoise's static files, any ``FileResponse``) gets an async iterator here before it is
sent: given the sync one, Django warns ("StreamingHttpResponse must consume synchronous iterators in order to serve
them asynchronously") and reads the whole body into a list first. Streaming views of our own yield asynchronously
already (the usage CSV export, ``inference.metering.api``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import BinaryIO, cast

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse

# Bytes per read of a streamed file: each read is one hop to a worker thread.
ASYNC_READ_BYTES = 256 * 1024


async def _file_chunks(filelike: BinaryIO) -> AsyncIterator[bytes]:
    read = sync_to_async(filelike.read, thread_sensitive=False)
    while chunk := await read(ASYNC_READ_BYTES):
        yield chunk


async def _parts(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:  # a streaming response that is not a file: its parts cost no I/O to produce
        yield part


def stream_async(response: HttpResponseBase) -> HttpResponseBase:
    """Give a sync streaming response an async iterator, reading its file (if any) off the event loop in
    :data:`ASYNC_READ_BYTES` blocks; the file is still closed with the response. Other responses are unchanged."""
    if isinstance(response, StreamingHttpResponse) and not response.is_async:
        filelike = getattr(response, "file_to_stream", None)
        parts = cast(Iterable[bytes], response.streaming_content)  # sync: ``is_async`` is false
        content = _file_chunks(filelike) if filelike is not None else _parts(parts)
        response.streaming_content = content
    return response


class SyncChainASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose middleware chain and views run in the request's one thread (see the module doc)."""

    def load_middleware(self, is_async: bool = False) -> None:
        """Build the chain in sync mode, then make it awaitable as ``ASGIHandler.get_response_async`` expects."""
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)  # type: ignore[has-type]

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """The chain's response, a sync streaming one made async (:func:`stream_async`)."""
        return stream_async(await super().get_response_async(request))


def get_asgi_application() -> SyncChainASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``: set Django up, return the handler."""
    django.setup(set_prefix=False)
    return SyncChainASGIHandler()
