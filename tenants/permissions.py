"""Permission for every tenant endpoint: scopes for API keys, roles for session users.

Each view may declare a per-method ``scope_map`` (getsentry/sentry ``organization.py`` style) for keys and a
``role_map`` for console sessions (viewer < member < owner). The defaults: reads need ``adapters:read`` / viewer,
writes ``adapters:write`` / member.
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from tenants.access import access_for
from tenants.models import Membership
from tenants.scopes import ADAPTERS_READ, ADAPTERS_WRITE

READ_METHODS = ("GET", "HEAD", "OPTIONS")
DEFAULT_SCOPE_MAP = {
    "GET": ADAPTERS_READ,
    "HEAD": ADAPTERS_READ,
    "OPTIONS": ADAPTERS_READ,
    "POST": ADAPTERS_WRITE,
    "PUT": ADAPTERS_WRITE,
    "PATCH": ADAPTERS_WRITE,
    "DELETE": ADAPTERS_WRITE,
}
DEFAULT_ROLE_MAP = {
    **{m: Membership.Role.VIEWER for m in READ_METHODS},
    **{m: Membership.Role.MEMBER for m in ("POST", "PUT", "PATCH", "DELETE")},
}


class HasScope(permissions.BasePermission):
    """Allows a key holding the scope ``scope_map`` names, or a session user whose role reaches ``role_map``'s.

    Resolving the caller's tenant here also answers 404/400 for a tenant the session user cannot act in.
    """

    message = "This API key lacks the scope this call needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        """True when the caller may use this method on this view (see the class docstring)."""
        access = access_for(request)
        method = request.method or "GET"
        if access.api_key is not None:
            needed = getattr(view, "scope_map", DEFAULT_SCOPE_MAP).get(method)
            return needed is not None and needed in access.api_key.scopes
        role = getattr(view, "role_map", DEFAULT_ROLE_MAP).get(method)
        if role is None or not access.has_role(role):
            self.message = f"Your role in tenant '{access.tenant.slug}' is {access.role}; this needs {role or 'another'}."
            return False
        return True
