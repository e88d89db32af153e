"""Read-only operator API (staff sessions): nodes with gauges and residency counts, the residency map, the nodes'
history, and traffic.

- ``GET /api/v1/operator/nodes?limit=&offset=``: a page of nodes by name (``common.pagination.BoundedPage``: 50 by
  default, at most 200; ``{"count", "next", "previous", "results"}``): health, slots used, KV-cache gauge,
  running/waiting, preemptions, recent failures, and placements counted per tier (``tiers``, ``pinned``).
- ``GET /api/v1/operator/residency?tenant=&limit=&offset=``: a page of the residency map, one row per adapter
  version placed on some node (of one tenant by slug, when given), each with its placements by node name.
- ``GET /api/v1/operator/nodes/{name}/samples``: the node's gauges over time (``inference.fleet.node_samples``).
- ``GET /api/v1/operator/traffic``: per adapter version, every tenant (``inference.metering.traffic``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.moments import MomentField
from common.pagination import BoundedPage
from inference.fleet.models import Node, Placement
from inference.fleet.node_samples import node_samples, slots_used
from inference.fleet.selectors import TIERS, node_residency_counts, residency_map_versions
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
    """A version's residency on one node (a cell of the residency map); ``id`` addresses the evict action."""
    node = serializers.CharField(source="node.name")

    class Meta:
        model = Placement
        fields = ["id", "node", "tier", "pinned", "served", "load_ms", "last_error", "updated_at"]


class ResidencyMapRowSerializer(serializers.Serializer):
    """One adapter version of the residency map (``version_id`` addresses pin, unpin and replicas) and its
    placements, by node name (``size_bytes``: the version's weights)."""
    version_id = serializers.IntegerField(source="id")
    tenant = serializers.CharField(source="adapter.tenant.slug")
    adapter = serializers.CharField(source="adapter.name")
    version = serializers.IntegerField(source="number")
    size_bytes = serializers.IntegerField()
    placements = PlacementOutputSerializer(many=True, source="map_placements")


class ResidencyMapQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/operator/residency``: ``tenant`` (a slug; all tenants when absent) and the page."""
    tenant = serializers.SlugField(required=False)


class NodeOutputSerializer(serializers.ModelSerializer):
    """A node's health, slots, gauges (``kv_cache_usage_perc`` 0..1) and residency counts.

    ``gpu_used`` / ``cpu_used``: adapters in GPU slots / in the engine's CPU cache (GPU residents included) from the
    last heartbeat; ``num_preemptions_total``: vLLM's counter; ``failed_requests_5m``: requests this node answered
    with status >= 500 in the last 5 minutes (gateway metering; a caller's own 4xx is not the node's failure);
    ``tiers``: its placement rows per tier (every tier present), ``pinned``: how many are pinned (the placements
    themselves: ``GET /api/v1/operator/residency``).
    """
    base_model = serializers.CharField(source="base_model.base_model_name", allow_null=True, default=None)
    gpu_used = serializers.SerializerMethodField()
    cpu_used = serializers.SerializerMethodField()
    num_preemptions_total = serializers.SerializerMethodField()
    failed_requests_5m = serializers.IntegerField(read_only=True)
    tiers = serializers.SerializerMethodField()
    pinned = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["name", "base_model", "healthy", "last_heartbeat_at", "max_loras", "max_cpu_loras", "max_lora_rank",
                  "kv_cache_usage_perc", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
                  "gpu_used", "cpu_used", "failed_requests_5m", "tiers", "pinned"]

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

    def _counts(self, node: Node) -> dict[str, Any]:
        # A list sets ``residency_counts`` for its whole page in one query; a single node reads its own.
        counts = getattr(node, "residency_counts", None)
        if counts is None:
            counts = node_residency_counts(node_ids=[node.pk])[node.pk]
            node.residency_counts = counts  # type: ignore[attr-defined]
        return counts

    @extend_schema_field({"type": "object", "properties": {t: {"type": "integer"} for t in TIERS},
                          "required": list(TIERS)})
    def get_tiers(self, node: Node) -> dict[str, int]:
        """Placement rows on the node per tier: ``{"cold", "staged", "warm", "hot", "errored"}`` counts."""
        return dict(self._counts(node)["tiers"])

    def get_pinned(self, node: Node) -> int:
        """Pinned placement rows on the node."""
        return int(self._counts(node)["pinned"])


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
    """``GET /api/v1/operator/nodes``: a page of nodes with their residency counts (three queries: the count, the
    page with its failures, the page's placements counted per tier);
    ``GET /api/v1/operator/nodes/{name}/samples``: its gauges over time."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = NodeOutputSerializer
    pagination_class = BoundedPage
    lookup_field = "name"
    queryset = Node.objects.all()

    def get_queryset(self) -> QuerySet[Node]:
        """Nodes by name with their recent failures (the 5-minute window moves with each request)."""
        recent = timezone.now() - timedelta(minutes=5)
        return Node.objects.select_related("base_model").annotate(failed_requests_5m=Coalesce(Subquery(
            # no failed row is 0, not null (the console showed 0)
            UsageRecord.objects.filter(node=OuterRef("pk"), created_at__gte=recent, status_code__gte=500)
            .values("node").annotate(n=Count("id")).values("n")[:1]), 0)).order_by("name")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A page of nodes (``?limit=`` default 50, at most 200; ``?offset=``), by name."""
        page = self.paginate_queryset(self.get_queryset())
        nodes = list(page if page is not None else self.get_queryset())
        counts = node_residency_counts(node_ids=[n.pk for n in nodes])
        for node in nodes:
            node.residency_counts = counts[node.pk]  # type: ignore[attr-defined]  # read by the serializer
        return self.get_paginated_response(self.get_serializer(nodes, many=True).data)

    @extend_schema(parameters=[SamplesQuerySerializer], responses=NodeSampleSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # bounded by time (2,000 points), not paged
    def samples(self, request: Request, name: str | None = None) -> Response:
        """The node's gauges over ``[since, until)``, oldest first (at most 2,000 points)."""
        query = SamplesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        since = query.validated_data.get("since") or timezone.now() - timedelta(hours=1)
        node = self.get_object()
        return Response(node_samples(node, since=since, until=query.validated_data.get("until")))


class OperatorResidencyViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/operator/residency``: the residency map a page of adapter versions at a time."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = ResidencyMapRowSerializer
    pagination_class = BoundedPage

    def get_queryset(self) -> QuerySet[Any]:
        """Versions placed on some node, of ``?tenant=`` when given (400 for a malformed slug; an unknown one is an
        empty page), by tenant, adapter, newest version first."""
        query = ResidencyMapQuerySerializer(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return residency_map_versions(tenant_slug=query.validated_data.get("tenant"))

    @extend_schema(parameters=[ResidencyMapQuerySerializer])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A page of versions (``?limit=`` default 50, at most 200; ``?offset=``), each with every placement."""
        return super().list(request, *args, **kwargs)


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
