"""Scope-based permission: each view declares a per-method ``scope_map`` (getsentry/sentry ``organization.py`` style)."""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from tenants.authentication import TenantPrincipal
from tenants.scopes import ADAPTERS_READ, ADAPTERS_WRITE

DEFAULT_SCOPE_MAP = {
    "GET": ADAPTERS_READ,
    "HEAD": ADAPTERS_READ,
    "OPTIONS": ADAPTERS_READ,
    "POST": ADAPTERS_WRITE,
    "PUT": ADAPTERS_WRITE,
    "PATCH": ADAPTERS_WRITE,
    "DELETE": ADAPTERS_WRITE,
}


class HasScope(permissions.BasePermission):
    """Allows a request when its API key holds the scope the view's ``scope_map`` names for the method."""

    message = "This API key lacks the scope this call needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        """True when the key holds the scope ``scope_map`` names for this HTTP method."""
        user = request.user
        if not isinstance(user, TenantPrincipal):
            return False
        scope_map = getattr(view, "scope_map", DEFAULT_SCOPE_MAP)
        needed = scope_map.get(request.method or "GET")
        return needed is not None and needed in user.api_key.scopes
