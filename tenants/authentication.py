"""DRF authentication by tenant API key (``Authorization: Bearer <prefix>_<key_id>.<secret>``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from common import auth_hints
from tenants.models import ApiKey, Tenant
from tenants.services import ApiKeyInvalid, api_key_verify

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TenantPrincipal:
    """``request.user`` for key-authenticated calls: the tenant and the key acting for it."""

    tenant: Tenant
    api_key: ApiKey
    is_authenticated: bool = True
    is_anonymous: bool = False


def bearer_token(header: str) -> str | None:
    """The token from an ``Authorization`` header value, or None when it is not a Bearer header."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates tenant keys; failures are 401 because ``authenticate_header`` is implemented (conventions §4)."""

    def authenticate(self, request: Request) -> tuple[TenantPrincipal, ApiKey] | None:
        """``(principal, key)`` for a valid bearer key; None without a header; 401 for a bad one."""
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        token = bearer_token(header)
        if token is None:
            raise exceptions.AuthenticationFailed(auth_hints.malformed_header(), code="invalid_auth_header")
        try:
            key = api_key_verify(token)
        except ApiKeyInvalid as exc:
            logger.info("api_key.rejected", extra={"reason": exc.reason})
            raise exceptions.AuthenticationFailed(auth_hints.invalid_key(), code="invalid_api_key") from exc
        return TenantPrincipal(tenant=key.tenant, api_key=key), key

    def authenticate_header(self, request: Request) -> str:
        """Makes DRF answer 401 (not 403) to unauthenticated calls."""
        return 'Bearer realm="quiver"'
