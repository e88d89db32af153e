"""Reads for tenants and keys."""

from __future__ import annotations

from django.db.models import QuerySet

from tenants.models import ApiKey, Tenant


def api_key_list(tenant: Tenant) -> QuerySet[ApiKey]:
    """The tenant's keys, newest first."""
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at")
