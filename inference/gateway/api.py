"""Control-plane API for metering: ``GET /api/v1/usage[?since=<ISO 8601>]``."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from inference.gateway.models import UsageRecord
from inference.gateway.selectors import usage_summary
from tenants.viewsets import TenantScopedViewSet


class UsageQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/usage``: optional ``since`` (ISO 8601)."""
    since = serializers.DateTimeField(required=False)


class UsageViewSet(TenantScopedViewSet):
    """The caller's token usage per adapter version (and per base model), as metered by the gateway."""

    queryset = UsageRecord.objects.all()

    def list(self, request: Request) -> Response:
        """``GET /api/v1/usage``: token totals per adapter version (see ``usage_summary``)."""
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(usage_summary(self.get_queryset(), since=query.validated_data.get("since")))
