"""Operator API for tenants (staff sessions): every tenant's gateway limits and residency quota, and edits.

- ``GET /api/v1/operator/tenants``: ``[{"slug", "name", "limits": {...}, "residency_quota": {...}}]``.
- ``GET /api/v1/operator/tenants/{slug}``: one of them.
- ``GET /api/v1/operator/tenants/{slug}/limits``: its limits alone, in the shape ``PATCH`` takes.
- ``PATCH /api/v1/operator/tenants/{slug}/limits``: any of ``rpm_limit``, ``tpm_limit``, ``concurrency_limit``,
  ``max_tokens_limit`` (null = unlimited), ``priority_class``; audited (``FleetAuditRecord`` action ``set_limits``).
Residency quotas are edited at ``/api/v1/operator/residency-quotas/{slug}`` (``inference.fleet.api.fleet``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from inference.fleet import services as svc
from inference.fleet.api.fleet import OperatorViewSet, QuotaSerializer, _actor
from inference.fleet.models import TenantResidencyQuota
from tenants.models import LIMIT_FIELDS, Tenant
from tenants.serializers import LimitsSerializer


def _limits(tenant: Tenant) -> dict[str, Any]:
    return {name: getattr(tenant, name) for name in LIMIT_FIELDS}


class LimitsOutputSerializer(serializers.Serializer):
    """A tenant's gateway limits; null = unlimited (requests/min, tokens/min, in flight, one request's max_tokens)."""

    rpm_limit = serializers.IntegerField(allow_null=True)
    tpm_limit = serializers.IntegerField(allow_null=True)
    concurrency_limit = serializers.IntegerField(allow_null=True)
    max_tokens_limit = serializers.IntegerField(allow_null=True)
    priority_class = serializers.CharField(allow_null=True, help_text="high, normal or low; null = normal")


class OperatorTenantSerializer(serializers.Serializer):
    """One tenant as operators see it: limits and residency quota."""

    slug = serializers.CharField()
    name = serializers.CharField()
    limits = serializers.SerializerMethodField()
    residency_quota = serializers.SerializerMethodField()

    @extend_schema_field(LimitsOutputSerializer)
    def get_limits(self, tenant: Tenant) -> dict[str, Any]:
        """The limits and the priority class."""
        return _limits(tenant)

    @extend_schema_field(QuotaSerializer)
    def get_residency_quota(self, tenant: Tenant) -> dict[str, Any]:
        """``max_pinned`` and ``max_gpu_bytes`` (null = no limit)."""
        quota: TenantResidencyQuota | None = getattr(tenant, "quota", None)  # prefetched (one-to-one: one or None)
        return {"max_pinned": quota.max_pinned if quota else None,
                "max_gpu_bytes": quota.max_gpu_bytes if quota else None}


class OperatorTenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Tenants with their limits and quotas, by slug."""

    queryset = Tenant.objects.prefetch_related(
        Prefetch("residency_quota", queryset=TenantResidencyQuota.objects.all(), to_attr="quota")).order_by("slug")
    lookup_field = "slug"
    serializer_class = OperatorTenantSerializer

    @extend_schema(methods=["GET"], request=None, responses=LimitsOutputSerializer,
                   description="The tenant's gateway limits, every field present (null = unlimited / the default "
                               "class): the shape PATCH takes. Staff only; an unknown slug is 404.")
    @extend_schema(methods=["PATCH"], request=LimitsSerializer, responses=OperatorTenantSerializer,
                   description="Set any subset of the limits (audited); 400 names a bad field.")
    @action(detail=True, methods=["get", "patch"])
    def limits(self, request: Request, slug: str | None = None) -> Response:
        """``GET …/{slug}/limits``: the limits, every field present (null = unlimited / the default class), as
        ``PATCH`` takes them back. ``PATCH``: set any subset of the limits (audited); 400 names a bad field."""
        if request.method == "GET":
            return Response(LimitsOutputSerializer(_limits(self.get_object())).data)
        body = LimitsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        extra = sorted(set(request.data) - set(LIMIT_FIELDS)) if isinstance(request.data, dict) else []
        if extra:
            raise serializers.ValidationError({extra[0]: f"Only limits can be changed: {list(LIMIT_FIELDS)}."})
        svc.tenant_limits_set(self.get_object(), limits=dict(body.validated_data), actor=_actor(request))
        return Response(OperatorTenantSerializer(self.get_queryset().get(slug=slug)).data)
