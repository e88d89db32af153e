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
        role = getattr(view, "role_map", DEFAULT_ROLE_MAP).get(method)
        if access.api_key is not None:
            needed = getattr(view, "scope_map", DEFAULT_SCOPE_MAP).get(method)
            if needed is None or needed not in access.api_key.scopes:
                # Named, so the caller knows which key to make (a fresh user's finding: it did not say).
                self.message = (f"This API key lacks the scope '{needed}' this call needs; use a key that has it (mint "
                                "one on the console's API keys page or with POST /api/v1/api-keys)." if needed else
                                "API keys cannot make this call; use a console session.")
                return False
            if role == Membership.Role.OWNER and not _creator_is_owner(access):
                # A member may mint keys with adapters:write; those must not do what only owners may (delete an
                # adapter), or the role check would be one key away.
                self.message = ("This API key was created by a member; this call needs an owner's key or an owner's "
                                "console session.")
                return False
            return True
        if role is None or not access.has_role(role):
            self.message = f"Your role in tenant '{access.tenant.slug}' is {access.role}; this needs {role or 'another'}."
            return False
        return True


def _creator_is_owner(access: Any) -> bool:
    """Whether the caller's key was minted by an operator (no creator) or by a user who is now an owner of its tenant."""
    creator_id = access.api_key.created_by_id
    if creator_id is None:
        return True
    return Membership.objects.filter(tenant=access.tenant, user_id=creator_id, role=Membership.Role.OWNER).exists()
