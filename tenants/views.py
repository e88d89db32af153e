"""API key management for the calling tenant: list, create (secret shown once), revoke."""

from __future__ import annotations

from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from tenants import services
from tenants.models import ApiKey
from tenants.scopes import KEYS_MANAGE
from tenants.serializers import ApiKeyInputSerializer, ApiKeyOutputSerializer
from tenants.viewsets import TenantScopedViewSet

KEYS_SCOPE_MAP = {m: KEYS_MANAGE for m in ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")}


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """``/api/v1/api-keys``: the tenant's keys. Needs scope ``keys:manage``."""

    queryset = ApiKey.objects.order_by("-created_at")
    serializer_class = ApiKeyOutputSerializer
    lookup_field = "key_id"
    scope_map = KEYS_SCOPE_MAP

    def create(self, request: Request) -> Response:
        """``POST /api/v1/api-keys``: 201 with ``secret`` shown this once; scopes at most the caller's."""
        data = ApiKeyInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key, plaintext = services.api_key_create(self.tenant, granted_by=self.api_key, **data.validated_data)
        body = {**ApiKeyOutputSerializer(key).data, "secret": plaintext}
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, key_id: str | None = None) -> Response:
        """``POST /api/v1/api-keys/{key_id}/revoke``: disable the key for good (idempotent)."""
        key = self.get_object()
        key = services.api_key_revoke(self.tenant, key_id=key.key_id)
        return Response(ApiKeyOutputSerializer(key).data)
