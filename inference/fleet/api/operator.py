"""Read-only operator API (staff sessions): nodes with gauges and placements, their history, and traffic.

- ``GET /api/v1/operator/nodes``: health, slots used, KV-cache gauge, running/waiting, preemptions, recent failures,
  and every placement (tenant, adapter, version, tier, pinned).
- ``GET /api/v1/operator/nodes/{name}/samples``: the node's gauges over time (``inference.fleet.node_samples``).
- ``GET /api/v1/operator/traffic``: per adapter version, every tenant (``inference.metering.traffic``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.moments import MomentField
from inference.fleet.models import Node, Placement
from inference.fleet.node_samples import node_samples, slots_used
from inference.metering.api import (
    TrafficQuerySerializer,
    TrafficRowSerializer,
    drain_quietly,
    traffic_response,
)
from inference.metering.models import UsageHour, UsageRecord
from tenants.authentication import ApiKeyAuthentication, TenantPrincipal

# A tenant's key is recognised here (not ignored), so it gets 403 ``staff_required`` rather than a misleading
# "not authenticated"; a bad key is 401 and no credentials at all 401 with ``WWW-Authenticate``, as on tenant routes.
OPERATOR_AUTHENTICATION = [ApiKeyAuthentication, SessionAuthentication]


class IsStaffSession(permissions.BasePermission):
    """Only logged-in staff (operators); tenants' keys and non-staff sessions get 403 ``staff_required``."""

    message = "Operator pages need a staff account; log in to the console as staff."
    code = "staff_required"

    def has_permission(self, request: Request, view: Any) -> bool:
        """True for an authenticated staff user."""
        user = request.user
        if isinstance(user, TenantPrincipal):
            self.message = ("Tenant API keys cannot call operator endpoints; they need a staff account's console "
                            "session.")
            return False
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
    """A node's health, slots, gauges (``kv_cache_usage_perc`` 0..1) and placements.

    ``gpu_used`` / ``cpu_used``: adapters in GPU slots / in the engine's CPU cache (GPU residents included) from the
    last heartbeat; ``num_preemptions_total``: vLLM's counter; ``failed_requests_5m``: requests this node answered
    with status >= 500 in the last 5 minutes (gateway metering; a caller's own 4xx is not the node's failure).
    """
    base_model = serializers.CharField(source="base_model.base_model_name", allow_null=True, default=None)
    placements = PlacementOutputSerializer(many=True, source="placements_sorted")
    gpu_used = serializers.SerializerMethodField()
    cpu_used = serializers.SerializerMethodField()
    num_preemptions_total = serializers.SerializerMethodField()
    failed_requests_5m = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = ["name", "base_model", "healthy", "last_heartbeat_at", "max_loras", "max_cpu_loras", "max_lora_rank",
                  "kv_cache_usage_perc", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
                  "gpu_used", "cpu_used", "failed_requests_5m", "placements"]

    def get_gpu_used(self, node: Node) -> int:
        """Adapters in GPU slots."""
        return slots_used(node.state or {})[0]

    def get_cpu_used(self, node: Node) -> int:
        """Adapters in the engine's CPU cache."""
        return slots_used(node.state or {})[1]

    def get_num_preemptions_total(self, node: Node) -> float | None:
        """vLLM's ``num_preemptions_total`` counter from the last heartbeat."""
        value = (node.state or {}).get("num_preemptions_total")
        return float(value) if isinstance(value, (int, float)) else None


class SamplesQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/operator/nodes/{name}/samples``: ``since`` (default an hour ago), ``until``: ISO 8601 or a span back from now (``15m``, ``1h``, ``7d``)."""

    since = MomentField(required=False)
    until = MomentField(required=False)


class NodeSampleSerializer(serializers.Serializer):
    """One point of a node's history (``inference.fleet.node_samples.node_samples``)."""

    t = serializers.DateTimeField()
    healthy = serializers.BooleanField()
    kv_cache_usage_perc = serializers.FloatField(allow_null=True)
    num_requests_running = serializers.IntegerField(allow_null=True)
    num_requests_waiting = serializers.IntegerField(allow_null=True)
    num_preemptions_total = serializers.FloatField(allow_null=True)
    preemptions = serializers.FloatField(allow_null=True, help_text="increase since the previous point")
    gpu_used = serializers.IntegerField()
    cpu_used = serializers.IntegerField()


class NodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/operator/nodes``: every node with its placements (two queries plus joins);
    ``GET /api/v1/operator/nodes/{name}/samples``: its gauges over time."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = NodeOutputSerializer
    pagination_class = None
    lookup_field = "name"
    queryset = Node.objects.all()

    def get_queryset(self) -> QuerySet[Node]:
        """Nodes with placements and their recent failures (the 5-minute window moves with each request)."""
        recent = timezone.now() - timedelta(minutes=5)
        return Node.objects.select_related("base_model").prefetch_related(Prefetch(
            "placements", to_attr="placements_sorted",
            queryset=Placement.objects.select_related("adapter_version__adapter__tenant").order_by(
                "adapter_version__adapter__tenant__slug", "adapter_version__adapter__name", "-adapter_version__number"),
        )).annotate(failed_requests_5m=Coalesce(Subquery(  # no failed row is 0, not null (the console showed 0)
            UsageRecord.objects.filter(node=OuterRef("pk"), created_at__gte=recent, status_code__gte=500)
            .values("node").annotate(n=Count("id")).values("n")[:1]), 0)).order_by("name")

    @extend_schema(parameters=[SamplesQuerySerializer], responses=NodeSampleSerializer(many=True))
    @action(detail=True, methods=["get"])
    def samples(self, request: Request, name: str | None = None) -> Response:
        """The node's gauges over ``[since, until)``, oldest first (at most 2,000 points)."""
        query = SamplesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        since = query.validated_data.get("since") or timezone.now() - timedelta(hours=1)
        node = self.get_object()
        return Response(node_samples(node, since=since, until=query.validated_data.get("until")))


class OperatorTrafficViewSet(viewsets.GenericViewSet):
    """``GET /api/v1/operator/traffic``: every tenant's traffic per adapter version (staff sessions)."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = TrafficRowSerializer
    pagination_class = None
    queryset = UsageRecord.objects.all()

    @extend_schema(parameters=[TrafficQuerySerializer], responses=TrafficRowSerializer(many=True))
    def list(self, request: Request) -> Response:
        """Rows sorted by requests, most first. Hourly sparklines (periods over 6 h) read the whole final hours from
        the hourly sums, as the tenant's table does: a day of every tenant is otherwise every record of the day."""
        drain_quietly()
        return traffic_response(self.get_queryset(), request, hours=UsageHour.objects.all())
