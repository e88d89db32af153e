"""The one base class that scopes every query by tenant (conventions §2, PostHog ``TeamAndOrgViewSetMixin``)."""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404
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
    # The lookup from the model to its adapter's name (``"name"``, ``"adapter__name"``): a key limited to some
    # adapters (``ApiKey.adapters``) sees only their rows, the others as if they did not exist (404, docs/security.md).
    # None: the model's rows are not an adapter's.
    adapter_field: str | None = None

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

    @property
    def key_adapter_names(self) -> frozenset[str] | None:
        """The adapter names the caller's key is limited to (``"name@2"`` counts as ``"name"``), or None when it
        reaches every adapter of its tenant (an unlimited key, a console session)."""
        key = self.principal.api_key
        return (key.adapter_names or None) if key is not None else None

    def adapter_in_reach(self, name: str) -> None:
        """Raise ``Http404`` when the caller's key is limited to adapters other than ``name``: the same answer as
        for an adapter that does not exist, so a limited key learns nothing about the others (nor creates them)."""
        names = self.key_adapter_names
        if names is not None and name not in names:
            raise Http404

    def tenant_queryset(self, queryset: QuerySet) -> QuerySet:
        """Narrow the tenant's queryset further; the default keeps it."""
        return queryset

    def get_queryset(self) -> QuerySet:
        """Final: the model's rows filtered by the caller's tenant, then ``tenant_queryset``."""
        base = cast(QuerySet, type(self).queryset)
        assert base is not None, "set queryset on the viewset"
        tenant = self.tenant  # authenticates even for shared catalogues
        scoped = base.all() if self.tenant_field is None else base.filter(**{self.tenant_field: tenant})
        if self.adapter_field is not None:
            scoped = self.within_key_adapters(scoped, self.adapter_field)
        return self.tenant_queryset(scoped)

    def within_key_adapters(self, queryset: QuerySet, adapter_field: str) -> QuerySet:
        """``queryset`` narrowed to rows whose ``adapter_field`` (a lookup to an adapter's name) is one of the
        caller's key's adapters (:attr:`key_adapter_names`); unchanged for a caller reaching every adapter."""
        names = self.key_adapter_names
        return queryset if names is None else queryset.filter(**{f"{adapter_field}__in": sorted(names)})
