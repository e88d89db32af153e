"""OpenAI-shaped errors for ``/v1/*``: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

from django.http import JsonResponse
from starlette.responses import Response

from common.echo import clip


class GatewayError(Exception):
    """An error to answer in OpenAI's shape.

    Args:
        status: HTTP status.
        message: what went wrong and how to fix it.
        code: stable code, e.g. ``model_not_found``.
        type_: OpenAI error type (``invalid_request_error``, ``authentication_error``, ``server_error``...).
        param: the request field concerned, if any.
        headers: extra response headers (``Allow``, ``Retry-After``, ``x-ratelimit-*``...).
    """

    def __init__(self, status: int, message: str, *, code: str, type_: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = dict(headers or {})
        self.status = status
        self.message = message
        self.code = code
        self.type = type_
        # A field name can be a caller's JSON key: never echo one whole.
        self.param = None if param is None else clip(param)
        # (key, model as sent, target or None) once the caller's tenant is known: the refusal is metered
        # (inference.gateway.exchange.meter_refusal).
        self.metered: tuple[Any, str, Any] | None = None

    def body(self) -> dict[str, dict[str, str | None]]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        """The OpenAI-shaped JSON response (with ``WWW-Authenticate`` on 401)."""
        resp = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            resp[name] = value
        if self.status == 401:
            resp["WWW-Authenticate"] = 'Bearer realm="quiver"'
        return resp


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, headers=headers,
                    media_type="application/json")


def error_response(exc: GatewayError) -> Response:
    """OpenAI's ``{"error": {...}}`` for ``exc``, with ``WWW-Authenticate`` on 401 and ``Allow`` on 405."""
    headers = dict(exc.headers)
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="quiver"'
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return _json(body, exc.status, headers)
