"""The control-plane API's error envelope: ``{"detail": str, "code": str}`` plus ``fields`` for validation errors.

Decided in docs/architecture.md (``common/``); the OpenAI-compatible ``/v1/*`` routes keep OpenAI's shape instead.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common import auth_hints
from common.echo import clip

logger = logging.getLogger(__name__)
DETAIL_MAX_CHARS = 1000


class QuiverError(exceptions.APIException):
    """An API error with a stable machine-readable ``code`` and an HTTP status.

    Args:
        detail: human message naming the field and the fix.
        code: stable snake_case code, e.g. ``"adapter_not_ready"``.
        status_code: HTTP status, 400 by default.
        fields: optional per-field messages, returned as ``fields``.
    """

    status_code: int = status.HTTP_400_BAD_REQUEST

    def __init__(self, detail: str, *, code: str, status_code: int = 400, fields: dict[str, Any] | None = None):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.code = code
        self.fields = fields


class DatabaseUnavailable(exceptions.APIException):
    """503 ``database_unavailable``: the database refused or dropped the connection; retry (``Retry-After``)."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The database is unavailable right now; retry in a few seconds."
    default_code = "database_unavailable"


def _first_code(codes: Any) -> str:
    if isinstance(codes, str):
        return codes
    if isinstance(codes, list) and codes:
        return _first_code(codes[0])
    if isinstance(codes, dict) and codes:
        return _first_code(next(iter(codes.values())))
    return "error"


def _first_message(detail: Any) -> str:
    """The first human message inside DRF's nested error detail (lists of dicts of lists ...)."""
    if isinstance(detail, dict):
        return _first_message(next(iter(detail.values()), ""))
    if isinstance(detail, list):
        return _first_message(detail[0]) if detail else ""
    return str(detail)


JSON_FIX = ("Send one JSON object (e.g. `{\"version\": 2}`) with `Content-Type: application/json`; the position "
            "above counts from the body's first character.")
CSRF_FIX = ("A console session must send the `csrftoken` cookie's value as the `X-CSRFToken` header on every POST, PUT, "
            "PATCH and DELETE (the console does); scripts should send an API key instead.")


def _fix(exc: exceptions.APIException, context: dict[str, Any]) -> str | None:
    """The fix to append to DRF's generic parse, media-type and authentication errors, or None (fresh-user round,
    issue 30: "JSON parse error - Expecting value" and "Authentication credentials were not provided." named none)."""
    detail = str(exc.detail)
    if isinstance(exc, exceptions.NotAuthenticated):
        return auth_hints.missing_credentials()
    if isinstance(exc, exceptions.ParseError) and detail.startswith("JSON parse error") and "send" not in detail:
        return JSON_FIX
    if isinstance(exc, exceptions.ParseError) and detail.startswith("Multipart form parse error"):
        return ("Send the files as multipart/form-data and let the client write the Content-Type with its boundary "
                "(curl: `-F files=@adapter_config.json`; never set that header by hand).")
    if isinstance(exc, exceptions.UnsupportedMediaType):
        accepted = [p.media_type for p in getattr(context.get("request"), "parsers", None) or []]
        fix = ("Send a JSON body with `Content-Type: application/json`" if "application/json" in accepted
               else f"Send `Content-Type: {accepted[0]}`" if accepted else "Send a body this endpoint reads")
        return f"{fix} (this endpoint reads {', '.join(accepted)})." if accepted else f"{fix}."
    if isinstance(exc, exceptions.PermissionDenied) and detail.startswith("CSRF Failed"):
        return CSRF_FIX
    return None


def _with_fix(exc: exceptions.APIException, context: dict[str, Any]) -> None:
    """Append :func:`_fix`'s text to ``exc``'s detail in place: DRF set the status, the code and, for a 401, the
    ``WWW-Authenticate`` header on this very object, so it is kept rather than replaced."""
    fix = _fix(exc, context)
    if fix is None or isinstance(exc.detail, (list, dict)):
        return
    if isinstance(exc, exceptions.NotAuthenticated):  # DRF's sentence says nothing the fix does not
        exc.detail = exceptions.ErrorDetail(fix, code=exc.detail.code)
        return
    exc.detail = exceptions.ErrorDetail(f"{str(exc.detail).rstrip('.')}. {fix}", code=exc.detail.code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render every API exception as ``{"detail", "code"[, "fields"]}``.

    Returns:
        The response, or None for non-API exceptions (Django then answers 500).
    """
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, (OperationalError, InterfaceError)):
        # PostgreSQL restarting or unreachable: the next request gets a fresh connection (CONN_MAX_AGE 0), so say
        # "retry" rather than 500. Workers and the gateway need no restart.
        logger.warning("api.database_unavailable %r", exc, extra={"error": repr(exc)})
        exc = DatabaseUnavailable()
    elif isinstance(exc, DataError):
        # PostgreSQL refuses a value the query holds (NUL in text, a number past its column); SQLite does not, so
        # the demo answered 404 where production answered 500. A path segment no row can hold names nothing: 404.
        kwargs = context.get("kwargs") or {}
        if any("\x00" in str(v) for v in kwargs.values()):
            exc = exceptions.NotFound()
        else:
            exc = QuiverError("A value in this request cannot be stored or looked up (a NUL character, or a number "
                              "out of range); remove it and retry.", code="invalid_value")
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})
    elif isinstance(exc, exceptions.APIException) and not isinstance(exc, QuiverError):
        _with_fix(exc, context)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, QuiverError):
        body: dict[str, Any] = {"detail": str(exc.detail), "code": exc.code}
        if exc.fields:
            body["fields"] = exc.fields
    elif isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        first_field, first_msgs = next(iter(fields.items())) if fields else ("", [])
        first_msg = _first_message(first_msgs)
        body = {
            "detail": f"Invalid input for '{first_field}': {first_msg}",
            "code": "invalid",
            "fields": fields,
        }
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        body = {"detail": str(detail), "code": _first_code(codes)}
    # A net under the messages that quote inputs (common.echo.clip): DRF's own ones quote them whole too
    # ('"<value>" is not a valid choice.').
    body["detail"] = clip(body["detail"], DETAIL_MAX_CHARS)
    response.data = body
    if isinstance(exc, DatabaseUnavailable):
        response["Retry-After"] = "5"
    return response
