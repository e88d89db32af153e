"""The front door: an ASGI middleware in front of Django that bounds request bodies while they are read.

Django's ASGI handler spools a whole body to a temp file before routing or authentication, so without this anyone
could fill the disk without a key. Here, before the application sees a byte:

- a route's body cap applies to the declared ``Content-Length`` (refused at once) and to what is actually received,
  chunked bodies included (refused as soon as the count passes the cap; the rest is never read);
- caps per route: the upload route (``POST /api/v1/adapters/{name}/versions``) at ``QUIVER_MAX_UPLOAD_BYTES`` plus
  multipart framing, everything else at ``QUIVER_MAX_JSON_BYTES``; a request with no credentials at all at
  ``QUIVER_MAX_ANONYMOUS_BODY_BYTES`` (enough for a login form);
- routes that only ever serve credentialed callers (``/v1/*``, ``/internal/*``, the upload route) refuse a request
  without credentials with 401 before reading its body; the upload route also verifies the API key or session first,
  and that it may upload at all (scope ``adapters:write``, or an owner/member session), since its cap is large;
- a body that may pass the anonymous cap (declared larger, or chunked) is read only once its credentials are
  verified (a live API key or a logged-in session): junk in ``Authorization`` no longer buys the JSON cap. Paths
  whose application authenticates before reading (the gateway's) and the node listener's ``/internal/*`` (node keys)
  skip this.

Refusals use the envelope of the route: OpenAI's ``{"error": {...}}`` on ``/v1/*``, ``{"detail", "code"}`` elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from common import auth_hints

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Django's handler types its arguments more narrowly

UPLOAD_ROUTE = re.compile(r"^/api/v1/adapters/[^/]+/versions/?$")
# Multipart boundaries and part headers around the files (a few hundred bytes per part; 64 KiB is generous).
MULTIPART_OVERHEAD = 64 * 1024
CREDENTIALED_PREFIXES = ("/v1/", "/internal/")


@dataclass(frozen=True)
class BodyRule:
    """How one request's body is bounded.

    Attributes:
        max_bytes: the cap in bytes (declared and received).
        needs_credentials: refuse with 401 before reading when the request carries no credentials.
        verify: check the credentials themselves (not just their presence) before reading.
        what: the human name of the limit for messages, e.g. ``"QUIVER_MAX_UPLOAD_BYTES"``.
    """

    max_bytes: int
    needs_credentials: bool
    verify: bool
    what: str


def rule_for(method: str, path: str, *, has_credentials: bool, content_type: str = "multipart/form-data") -> BodyRule:
    """The body rule of a request, from settings (read each time, so tests may override them).

    Args:
        method: HTTP method, upper case.
        path: the URL path.
        has_credentials: whether an ``Authorization`` header or a session cookie is present.
        content_type: the ``Content-Type`` header; only multipart bodies get the upload cap on the upload route
            (a JSON body there is parsed in memory, so it keeps the JSON cap).
    """
    multipart = content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"
    if method == "POST" and UPLOAD_ROUTE.match(path):
        if multipart:
            return BodyRule(settings.QUIVER_MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD, True, True, "QUIVER_MAX_UPLOAD_BYTES")
        return BodyRule(settings.QUIVER_MAX_JSON_BYTES, True, True, "QUIVER_MAX_JSON_BYTES")
    needs = path.startswith(CREDENTIALED_PREFIXES)
    if not has_credentials and not needs:
        return BodyRule(settings.QUIVER_MAX_ANONYMOUS_BODY_BYTES, False, False, "QUIVER_MAX_ANONYMOUS_BODY_BYTES")
    return BodyRule(settings.QUIVER_MAX_JSON_BYTES, needs, False, "QUIVER_MAX_JSON_BYTES")


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _session_key(headers: dict[str, str]) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == settings.SESSION_COOKIE_NAME and value:
            return value
    return None


def upload_refusal(authorization: str, session_key: str | None) -> tuple[int, str, str] | None:
    """Why the upload route must refuse before reading the body, or None when the caller may upload.

    The body may be ``QUIVER_MAX_UPLOAD_BYTES`` (hundreds of MB, spooled to disk by Django), so it is read only for
    a caller able to upload: an active API key with ``adapters:write``, or a logged-in user who is owner or member of
    some tenant (the tenant itself is resolved later). Database lookups: run in a thread.

    Args:
        authorization: the ``Authorization`` header value ("" if absent).
        session_key: the session cookie's value, or None.

    Returns:
        ``(status, code, message)`` (401 ``invalid_api_key``, 403 ``insufficient_scope``), or None.
    """
    from tenants.authentication import bearer_token
    from tenants.models import Membership
    from tenants.scopes import ADAPTERS_WRITE
    from tenants.services import ApiKeyInvalid, api_key_verify

    invalid = (401, "invalid_api_key", auth_hints.invalid_key())
    # No key and no live session (the code stays invalid_api_key, as before): the text says what to send.
    ended = (401, "invalid_api_key", auth_hints.missing_credentials())
    scope = (403, "insufficient_scope", f"Uploading needs an API key with scope '{ADAPTERS_WRITE}' (or a console "
             "session of a tenant owner or member).")
    token = bearer_token(authorization) if authorization else None
    if authorization and token is None:
        return 401, "invalid_auth_header", auth_hints.malformed_header()
    if token is not None:
        try:
            key = api_key_verify(token)
        except ApiKeyInvalid:
            return invalid
        return None if ADAPTERS_WRITE in key.scopes else scope
    if session_key:
        user_id = import_module(settings.SESSION_ENGINE).SessionStore(session_key).get("_auth_user_id")
        if not user_id:
            return ended
        writer = Membership.objects.filter(user_id=user_id, role__in=[Membership.Role.OWNER, Membership.Role.MEMBER])
        return None if writer.exists() else scope
    return ended


def credentials_refusal(authorization: str, session_key: str | None) -> tuple[int, str, str] | None:
    """Why a request whose body may pass ``QUIVER_MAX_ANONYMOUS_BODY_BYTES`` must be refused before it is read.

    An ``Authorization`` header decides when present (DRF's order: the API key first), else the session cookie.

    Args:
        authorization: the ``Authorization`` header value ("" if absent).
        session_key: the session cookie's value, or None.

    Returns:
        ``(401, code, message)`` for a malformed header (``invalid_auth_header``), a bad key (``invalid_api_key``)
        or an anonymous/expired session (``not_authenticated``); None when the credentials are good.
    """
    from tenants.authentication import bearer_token
    from tenants.services import ApiKeyInvalid, api_key_verify

    if authorization:
        token = bearer_token(authorization)
        if token is None:
            return 401, "invalid_auth_header", auth_hints.malformed_header()
        try:
            api_key_verify(token)
        except ApiKeyInvalid:
            return 401, "invalid_api_key", auth_hints.invalid_key()
        return None
    if session_key and import_module(settings.SESSION_ENGINE).SessionStore(session_key).get("_auth_user_id"):
        return None
    return 401, "not_authenticated", auth_hints.missing_credentials()


DATABASE_UNAVAILABLE = (503, "database_unavailable", "The database is unavailable right now; retry in a few seconds.")
RETRY_AFTER_S = 5  # as common.exceptions answers for the same error inside Django


def checked_upload_refusal(authorization: str, session_key: str | None, *,
                           check: Callable[[str, str | None], tuple[int, str, str] | None] = upload_refusal,
                           ) -> tuple[int, str, str] | None:
    """``check`` (:func:`upload_refusal` or :func:`credentials_refusal`) with the database connection handled as a
    Django request handles it.

    This runs outside Django's request cycle (in asgiref's shared thread), so no ``request_started``/``finished``
    closes its connection: without this, a connection PostgreSQL dropped (restart, failover, idle timeout) stays in
    the thread and the next upload answers 500. Closed before (so a dropped one is replaced) and after (none is kept
    idle, as with ``CONN_MAX_AGE`` 0); a database that is down gives 503 ``database_unavailable`` instead of 500.

    Returns:
        As :func:`upload_refusal`, or ``(503, "database_unavailable", message)``.
    """
    from django.db import InterfaceError, OperationalError, close_old_connections, connection

    own = not connection.in_atomic_block  # never inside a caller's transaction (a test lending its thread)
    if own:
        close_old_connections()
    try:
        return check(authorization, session_key)
    except (OperationalError, InterfaceError):
        return DATABASE_UNAVAILABLE
    finally:
        if own:
            connection.close()


def _refusal(path: str, status: int, code: str, message: str) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="quiver"'))
    if status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    if path.startswith("/v1/"):
        kind = {401: "authentication_error", 503: "server_error"}.get(status, "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers
    return {"detail": message, "code": code}, headers


async def _respond(send: Send, path: str, status: int, code: str, message: str) -> None:
    body, headers = _refusal(path, status, code, message)
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


def _too_large(rule: BodyRule) -> str:
    return (f"Request body exceeds {rule.max_bytes} bytes ({rule.what}); send a smaller body, or ask an operator to "
            f"raise {rule.what}.")


class FrontDoor:
    """ASGI middleware enforcing :func:`rule_for` on every HTTP request; other scopes pass through.

    Args:
        app: the application behind it (Django's ASGI handler).
        self_authenticating: exact paths whose application verifies credentials before it reads the body (the
            gateway's routes, whose key cache makes that free), so the front door need not.
    """

    def __init__(self, app: ASGIApp, *, self_authenticating: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.self_authenticating = self_authenticating

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse or bound the request, then hand it to ``self.app``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        headers = _headers(scope)
        authorization = headers.get("authorization", "")
        session_key = _session_key(headers)
        rule = rule_for(scope.get("method", "GET"), path, has_credentials=bool(authorization or session_key),
                        content_type=headers.get("content-type", ""))
        if rule.needs_credentials and not (authorization or session_key):
            # The gateway (/v1/) takes keys only; the control plane takes a console session too.
            missing = auth_hints.missing_key() if path.startswith("/v1/") else auth_hints.missing_credentials()
            await _respond(send, path, 401, "not_authenticated", missing)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > rule.max_bytes:
            await _respond(send, path, 413, "request_too_large", _too_large(rule))
            return
        if rule.verify:
            refusal = await sync_to_async(checked_upload_refusal)(authorization, session_key)
        elif self._may_pass_anonymous_cap(path, headers, rule):
            refusal = await sync_to_async(checked_upload_refusal)(authorization, session_key,
                                                                  check=credentials_refusal)
        else:
            refusal = None
        if refusal is not None:
            await _respond(send, path, *refusal)
            return
        await self._bounded(scope, receive, send, rule, path)

    def _may_pass_anonymous_cap(self, path: str, headers: dict[str, str], rule: BodyRule) -> bool:
        # Only a credentialed request gets more than the anonymous cap; ordinary small bodies and GETs (no length,
        # not chunked: no body) cost no lookup.
        anonymous = settings.QUIVER_MAX_ANONYMOUS_BODY_BYTES
        if rule.max_bytes <= anonymous or path in self.self_authenticating or path.startswith("/internal/"):
            return False
        declared = headers.get("content-length", "")
        if declared.isdigit():
            return int(declared) > anonymous
        return "chunked" in headers.get("transfer-encoding", "").lower()

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, rule: BodyRule, path: str) -> None:
        received = 0
        overflow = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, overflow
            if overflow:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > rule.max_bytes:
                    # Django's body reader treats a disconnect as an aborted request and answers nothing.
                    overflow = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                if overflow:
                    return  # the 413 below answers instead
                started = True
            if overflow and not started:
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not overflow:
                raise
        if overflow and not started:
            await _respond(send, path, 413, "request_too_large", _too_large(rule))
