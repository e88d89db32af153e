"""The one base class that scopes every query by tenant (conventions §2, PostHog ``TeamAndOrgViewSetMixin``)."""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.db.models import QuerySet
from rest_framework import viewsets

from tenants.access import Access, access_for
from tenants.models import ApiKey, Tenant


class TenantScopedViewSet(viewsets.GenericViewSet):
    """Resolves the tenant from the API key or the session's chosen tenant and makes ``get_queryset`` final.

    Subclasses implement ``tenant_queryset(qs)`` and set ``queryset``; the base filters by ``tenant`` first, so another
    tenant's object is simply not found (404), never 403 (conventions §3).
    """

    # None marks shared, read-only catalogues (base models) that every tenant may list.
    tenant_field: str | None = "tenant"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(f"{cls.__name__} must implement tenant_queryset(), not get_queryset().")

    @property
    def principal(self) -> Access:
        """The caller's tenant, key or session user and role; raises NotAuthenticated without one."""
        return access_for(self.request)

    @property
    def tenant(self) -> Tenant:
        """The caller's tenant (from the API key, or the session user's chosen tenant)."""
        return self.principal.tenant

    @property
    def api_key(self) -> ApiKey | None:
        """The API key this request authenticated with; None for console sessions."""
        return self.principal.api_key

    @property
    def user(self) -> User | None:
        """The session user; None for API-key callers."""
        return self.principal.user

    def tenant_queryset(self, queryset: QuerySet) -> QuerySet:
        """Narrow the tenant's queryset further; the default keeps it."""
        return queryset

    def get_queryset(self) -> QuerySet:
        """Final: the model's rows filtered by the caller's tenant, then ``tenant_queryset``."""
        base = cast(QuerySet, type(self).queryset)
        assert base is not None, "set queryset on the viewset"
        tenant = self.tenant  # authenticates even for shared catalogues
        scoped = base.all() if self.tenant_field is None else base.filter(**{self.tenant_field: tenant})
        return self.tenant_queryset(scoped)
