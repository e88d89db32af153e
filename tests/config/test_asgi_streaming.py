"""Streaming responses under ASGI (config.sync_handler): a static file (whitenoise) is sent through an async
iterator, so Django neither warns "StreamingHttpResponse must consume synchronous iterators" nor reads the whole file
into memory before its first byte."""

from __future__ import annotations

import asyncio
import os
import warnings
from pathlib import Path
from typing import Any

from django.test import override_settings

from config.sync_handler import ASYNC_READ_BYTES, SyncChainASGIHandler
from tests.asgi_call import asgi_exchange, http_scope

SYNC_ITERATOR_WARNING = "must consume synchronous iterators"


def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, list[str]]:
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if not messages:
            await asyncio.sleep(3600)  # the client stays connected; Django cancels this once it has answered
        return messages.pop()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, response_headers, body = asgi_exchange(app, http_scope("GET", path, headers), receive)
    return status, response_headers, body, [str(w.message) for w in caught]


def test_a_static_file_streams_without_the_sync_iterator_warning(tmp_path: Path) -> None:
    content = os.urandom(2 * ASYNC_READ_BYTES + 123)  # several reads
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "bundle-abc123.js").write_bytes(content)
    with override_settings(STATICFILES_DIRS=[tmp_path]):
        app = SyncChainASGIHandler()  # whitenoise indexes the files when the chain is built
        status, headers, body, caught = _get(app, "/static/assets/bundle-abc123.js")
        assert status == 200 and body == content
        assert not [w for w in caught if SYNC_ITERATOR_WARNING in w], caught
        # A revalidation (304, no body) is streamed the same way.
        status, _, body, caught = _get(app, "/static/assets/bundle-abc123.js", {"if-none-match": headers["ETag"]})
        assert (status, body) == (304, b"")
        assert not [w for w in caught if SYNC_ITERATOR_WARNING in w], caught
