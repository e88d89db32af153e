"""OpenAI-shaped errors for ``/v1/*``: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import JsonResponse
from starlette.responses import Response

from common.echo import clip

logger = logging.getLogger(__name__)


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
        """The OpenAI-shaped JSON response (with ``WWW-Authenticate`` on 401); a 503 is logged
        (:func:`log_unavailable`)."""
        log_unavailable(self)
        resp = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            resp[name] = value
        if self.status == 401:
            resp["WWW-Authenticate"] = 'Bearer realm="quiver"'
        return resp


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status_code=status, headers=headers,
                    media_type="application/json")


def log_unavailable(exc: GatewayError, target: Any = None) -> None:
    """Log a 503 the gateway answers (no live node, a warm that failed or timed out, the database away) as one
    WARNING line, ``gateway.unavailable``, with its ``code``, what was asked (``model``) and where it would have run
    (``served``, ``base_model``, ``version_id``) and the ``tenant``: they were raised in node choice without a word,
    so an operator saw 503s in clients' reports and nothing in any log. Other statuses are not logged here (a 4xx is
    the caller's; a 502 is logged where the engine failed).

    Args:
        exc: the error being answered.
        target: the request's ``TargetView`` when the caller has it and ``exc.metered`` does not carry it (a
            reroute's node choice); otherwise the one in ``exc.metered``, if any.
    """
    if exc.status != 503:
        return
    key, model, seen_target = exc.metered or (None, "", None)
    target = target if target is not None else seen_target
    fields: dict[str, Any] = {"code": exc.code, "status": exc.status,
                              "model": clip(getattr(target, "requested", None) or model or "") or None}
    if target is not None:
        fields.update(served=target.served_name, base_model=target.base_model_name, version_id=target.version_id)
    if key is not None:
        fields["tenant"] = key.tenant_slug
    logger.warning("gateway.unavailable", extra={**fields, "detail": exc.message})


def error_response(exc: GatewayError, *, target: Any = None) -> Response:
    """OpenAI's ``{"error": {...}}`` for ``exc``, with ``WWW-Authenticate`` on 401 and ``Allow`` on 405; a 503 is
    logged (:func:`log_unavailable`, with ``target``: the request's ``TargetView`` when ``exc.metered`` lacks it)."""
    log_unavailable(exc, target)
    headers = dict(exc.headers)
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="quiver"'
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return _json(body, exc.status, headers)
