"""Who is calling and for which tenant: one ``Access`` for API-key and session (console) callers alike.

A key belongs to one tenant. A session user acts in one of their memberships' tenants, picked by the
``X-Quiver-Tenant`` header, else the session's ``quiver_tenant`` (``POST /api/v1/auth/tenant``), else their only
membership. Staff (operators) may pick any tenant and read it as a viewer unless they are also a member.
A tenant the user cannot act in is "not found" (404), like any other tenant's object (conventions §3).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AnonymousUser, User
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request

from common.echo import clip
from tenants.authentication import TenantPrincipal
from tenants.models import ApiKey, Membership, Tenant
from tenants.scopes import KEYS_MANAGE

TENANT_HEADER = "HTTP_X_QUIVER_TENANT"
SESSION_TENANT_KEY = "quiver_tenant"
ROLE_RANK = {Membership.Role.VIEWER: 0, Membership.Role.MEMBER: 1, Membership.Role.OWNER: 2}


@dataclass(frozen=True)
class Access:
    """The caller's tenant and standing: ``api_key`` for key callers, ``user`` and ``role`` for session callers."""

    tenant: Tenant
    api_key: ApiKey | None = None
    user: User | None = None
    role: str | None = None

    def has_role(self, needed: str) -> bool:
        """True when a session caller's role is at least ``needed`` (viewer < member < owner)."""
        return self.role is not None and ROLE_RANK[Membership.Role(self.role)] >= ROLE_RANK[Membership.Role(needed)]

    def acts_as_owner(self) -> bool:
        """Whether the caller may loosen limits an owner set (on keys and adapters): a session caller who is an
        owner, or a key with ``keys:manage`` (only owners and operators can grant that scope)."""
        if self.user is not None:
            return self.has_role(Membership.Role.OWNER)
        return self.api_key is not None and KEYS_MANAGE in self.api_key.scopes


def _session_user(request: Request) -> User | None:
    user = request.user
    if user is None or isinstance(user, AnonymousUser | TenantPrincipal) or not user.is_authenticated:
        return None
    return user


def tenant_choices(user: User) -> list[tuple[Tenant, str]]:
    """``(tenant, role)`` for each tenant ``user`` may act in: memberships, plus every tenant (viewer) for staff."""
    memberships = {m.tenant_id: (m.tenant, m.role) for m in Membership.objects.select_related("tenant").filter(user=user)}
    if getattr(user, "is_staff", False):
        for tenant in Tenant.objects.exclude(pk__in=memberships):
            memberships[tenant.pk] = (tenant, Membership.Role.VIEWER)
    return sorted(memberships.values(), key=lambda tr: tr[0].slug)


def _session_access(request: Request, user: User) -> Access:
    # Imported here: DRF loads this module while rest_framework.views (which common.exceptions needs) is loading.
    from common.exceptions import QuiverError

    wanted = request.META.get(TENANT_HEADER) or request.session.get(SESSION_TENANT_KEY)
    membership = None
    if wanted:
        membership = Membership.objects.select_related("tenant").filter(user=user, tenant__slug=wanted).first()
        if membership is not None:
            return Access(tenant=membership.tenant, user=user, role=membership.role)
        if getattr(user, "is_staff", False):
            tenant = Tenant.objects.filter(slug=wanted).first()
            if tenant is not None:
                return Access(tenant=tenant, user=user, role=Membership.Role.VIEWER)
        raise QuiverError(f"No tenant '{clip(wanted)}' among yours; pick one listed by GET /api/v1/auth/me.",
                          code="tenant_not_found", status_code=404)
    memberships = list(Membership.objects.select_related("tenant").filter(user=user)[:2])
    if len(memberships) == 1:
        return Access(tenant=memberships[0].tenant, user=user, role=memberships[0].role)
    if not memberships and not getattr(user, "is_staff", False):
        raise QuiverError("You belong to no tenant yet; ask a tenant owner to add you.", code="no_tenant",
                          status_code=403)
    raise QuiverError("Pick a tenant: send the header 'X-Quiver-Tenant: <slug>' or POST /api/v1/auth/tenant; "
                      "GET /api/v1/auth/me lists yours.", code="tenant_required", fields={"tenant": ["Required."]})


def access_for(request: Request) -> Access:
    """The caller's :class:`Access`, resolved once per request.

    Raises:
        NotAuthenticated: neither a valid key nor a logged-in session (401).
        QuiverError: ``tenant_not_found`` (404), ``tenant_required`` (400), ``no_tenant`` (403).
    """
    cached = getattr(request, "_quiver_access", None)
    if cached is not None:
        return cached
    user = request.user
    if isinstance(user, TenantPrincipal):
        access = Access(tenant=user.tenant, api_key=user.api_key)
    else:
        session_user = _session_user(request)
        if session_user is None:
            raise NotAuthenticated()
        access = _session_access(request, session_user)
    request._quiver_access = access  # type: ignore[attr-defined]
    return access
