"""Serving the built console (``frontend/dist``) from Django, so embedded mode needs no Node server.

Hashed assets go through whitenoise under ``STATIC_URL``; every other non-API path answers ``index.html`` (SPA
fallback: the console's router handles ``/adapters/x`` and friends). whitenoise's middleware is sync-only, which would
push every async gateway request through a thread; :class:`AsyncWhiteNoiseMiddleware` only takes that hop for static
paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import ensure_csrf_cookie
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    """whitenoise for static paths, usable in an async middleware chain without a thread hop for other paths."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[..., Any]) -> None:
        super().__init__(get_response)
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        """Serve a static file, or pass the request on (awaitable when the chain is async)."""
        if self._async:
            return self._acall(request)
        return super().__call__(request)

    def _static_response(self, request: HttpRequest) -> Any:
        # A miss is looked up again through the finders, so a console rebuilt after start-up is served too.
        found = self.files.get(request.path_info) if not self.autorefresh else None
        if found is None:
            found = self.find_file(request.path_info)
        return self.serve(found, request) if found is not None else None

    async def _acall(self, request: HttpRequest) -> Any:
        if request.path_info.startswith(self.static_prefix):
            response = await sync_to_async(self._static_response, thread_sensitive=False)(request)
            if response is not None:
                return response
        return await self.get_response(request)


def s3_browser_origins() -> list[str]:
    """The origins the console's browser-direct uploads PUT to (presigned for ``AWS_S3_BROWSER_ENDPOINT_URL``, else
    ``AWS_S3_ENDPOINT_URL``, else AWS's regional path-style endpoint: ``adapters_app.storage.s3_browser_client``)."""
    endpoint = settings.AWS_S3_BROWSER_ENDPOINT_URL or settings.AWS_S3_ENDPOINT_URL
    if endpoint:
        parts = urlsplit(endpoint)
        return [f"{parts.scheme}://{parts.netloc}"]
    region = settings.AWS_S3_REGION_NAME
    return [f"https://s3.{region}.amazonaws.com", "https://s3.amazonaws.com"]


def content_security_policy() -> str:
    """The console page's ``Content-Security-Policy``: everything from this origin only, nothing inline but styles.

    - scripts: the built bundle (``'self'``) and WebAssembly compilation (``'wasm-unsafe-eval'``: hash-wasm hashes
      uploads in the browser), never inline or ``eval`` (Vite emits no inline script);
    - styles: ``'unsafe-inline'`` as well, because Mantine sets CSS variables in a ``<style>`` tag and ``style``
      attributes at run time (https://mantine.dev/styles/css-variables/);
    - connections: the API (``'self'``), the S3 endpoint that browser-direct uploads send parts to, and ``data:``
      (the console answers a fresh upload's first part listing itself with a ``data:`` URL, ``s3upload.ts``; a
      ``data:`` URL sends nothing anywhere);
    - no plugins, no framing by other sites (``frame-ancestors 'none'``, as ``X-Frame-Options: DENY``), no ``<base>``
      or form posts elsewhere.

    The directives follow MDN's Content-Security-Policy reference and OWASP's CSP Cheat Sheet (strict default-src,
    explicit connect-src, frame-ancestors).
    """
    connect = " ".join(["'self'", "data:", *s3_browser_origins()])
    return ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data: blob:; font-src 'self' data:; "
            f"connect-src {connect}; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
            "form-action 'self'; frame-ancestors 'none'")


@ensure_csrf_cookie
def console_index(request: HttpRequest, path: str = "") -> HttpResponse:
    """``index.html`` of the built console for any console route, with :func:`content_security_policy`; 503 with the
    build command when not built."""
    index = settings.QUIVER_CONSOLE_DIR / "index.html"
    if not index.is_file():
        return JsonResponse({"detail": "The console is not built; run `npm ci && npm run build` in frontend/.",
                             "code": "console_not_built"}, status=503)
    response = HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-cache"  # assets are hashed; the page itself must be revalidated
    response["Content-Security-Policy"] = content_security_policy()
    return response
