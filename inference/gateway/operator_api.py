"""Read-only operator API (staff sessions): ``GET /api/v1/operator/nodes`` with each node's gauges and placements.

Until the fleet API lands this shows what the control plane records today: heartbeat health, slots, the KV-cache
gauge, running/waiting requests, and every placement (tenant, adapter, version, tier, pinned).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request

from inference.gateway.models import Node, Placement


class IsStaffSession(permissions.BasePermission):
    """Only logged-in staff (operators); tenants' keys and non-staff sessions get 403."""

    message = "Operator pages need a staff account."

    def has_permission(self, request: Request, view: Any) -> bool:
        """True for an authenticated staff user."""
        user = request.user
        return bool(user is not None and user.is_authenticated and getattr(user, "is_staff", False))


class PlacementOutputSerializer(serializers.ModelSerializer):
    """A version's residency on one node; ``id`` and ``version_id`` address the operator actions (evict, pin)."""
    version_id = serializers.IntegerField(source="adapter_version_id")
    tenant = serializers.CharField(source="adapter_version.adapter.tenant.slug")
    adapter = serializers.CharField(source="adapter_version.adapter.name")
    version = serializers.IntegerField(source="adapter_version.number")
    size_bytes = serializers.IntegerField(source="adapter_version.size_bytes")

    class Meta:
        model = Placement
        fields = ["id", "version_id", "tenant", "adapter", "version", "size_bytes", "tier", "pinned", "served", "load_ms", "last_error",
                  "updated_at"]


class NodeOutputSerializer(serializers.ModelSerializer):
    """A node's health, slots, gauges (``kv_cache_usage_perc`` 0..1) and placements."""
    base_model = serializers.CharField(source="base_model.base_model_name", allow_null=True, default=None)
    placements = PlacementOutputSerializer(many=True, source="placements_sorted")

    class Meta:
        model = Node
        fields = ["name", "base_model", "healthy", "last_heartbeat_at", "max_loras", "max_cpu_loras", "max_lora_rank",
                  "kv_cache_usage_perc", "num_requests_running", "num_requests_waiting", "placements"]


class NodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/operator/nodes``: every node with its placements (two queries plus joins)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsStaffSession]
    serializer_class = NodeOutputSerializer
    pagination_class = None
    queryset = Node.objects.select_related("base_model").prefetch_related(Prefetch(
        "placements", to_attr="placements_sorted",
        queryset=Placement.objects.select_related("adapter_version__adapter__tenant").order_by(
            "adapter_version__adapter__tenant__slug", "adapter_version__adapter__name", "-adapter_version__number"),
    )).order_by("name")
