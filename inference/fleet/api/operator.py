"""Read-only operator API (staff sessions): nodes with gauges and residency counts, the residency map, the nodes'
history, and traffic.

- ``GET /api/v1/operator/nodes?limit=&offset=``: a page of nodes by name (``common.pagination.BoundedPage``: 50 by
  default, at most 200; ``{"count", "next", "previous", "results"}``): health, slots used, KV-cache gauge,
  running/waiting, preemptions, recent failures, and placements counted per tier (``tiers``, ``pinned``).
- ``GET /api/v1/operator/residency?tenant=&limit=&offset=``: a page of the residency map, one row per adapter
  version placed on some node (of one tenant by slug, when given), each with its placements by node name.
- ``GET /api/v1/operator/nodes/{name}/samples``: the node's gauges over time (``inference.fleet.node_samples``).
- ``GET /api/v1/operator/traffic?since=&until=&bucket=&tenant=&ordering=&limit=&offset=``: a page of traffic per
  adapter version, every tenant (``inference.metering.traffic``), percentiles computed for the page only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
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
from inference.fleet.nodes import node_ceilings
from inference.fleet.selectors import TIERS, node_failures, node_residency_counts, residency_map_versions
from inference.metering.api import TrafficQuerySerializer, TrafficRowSerializer, drain_quietly
from inference.metering.models import UsageHour, UsageRecord
from inference.metering.traffic import ORDERINGS, order_rows, traffic_totals, with_percentiles
from inference.policy.node_capacity import CAPACITY_FIELDS
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


def failures_since() -> datetime:
    """Start of the nodes' failure window: 5 minutes before now (it moves with each request)."""
    return timezone.now() - timedelta(minutes=5)


_CAPACITY_SCHEMA = {"type": "object", "required": list(CAPACITY_FIELDS),
                    "properties": {f: {"type": "integer", "nullable": True} for f in CAPACITY_FIELDS}}


class NodeOutputSerializer(serializers.ModelSerializer):
    """A node's health, slots, gauges (``kv_cache_usage_perc`` 0..1) and residency counts.

    ``gpu_used`` / ``cpu_used``: adapters in GPU slots / in the engine's CPU cache (GPU residents included) from the
    last heartbeat; ``num_preemptions_total``: vLLM's counter; ``failed_requests_5m``: requests this node answered
    with status >= 500 in the last 5 minutes (gateway metering; a caller's own 4xx is not the node's failure);
    ``tiers``: its placement rows per tier (every tier present), ``pinned``: how many are pinned (the placements
    themselves: ``GET /api/v1/operator/residency``). ``max_loras`` / ``max_cpu_loras`` / ``max_lora_rank``: the
    figures placement and routing use, the heartbeat's clamped to the node's ceilings; ``reported``: what its last
    heartbeat claimed (null: not said), ``ceilings``: the ceilings in force (the operator's or the fleet's).
    """
    base_model = serializers.CharField(source="base_model.base_model_name", allow_null=True, default=None)
    gpu_used = serializers.SerializerMethodField()
    cpu_used = serializers.SerializerMethodField()
    num_preemptions_total = serializers.SerializerMethodField()
    failed_requests_5m = serializers.SerializerMethodField()
    tiers = serializers.SerializerMethodField()
    pinned = serializers.SerializerMethodField()
    reported = serializers.SerializerMethodField()
    ceilings = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["name", "base_model", "healthy", "last_heartbeat_at", "max_loras", "max_cpu_loras", "max_lora_rank",
                  "kv_cache_usage_perc", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
                  "gpu_used", "cpu_used", "failed_requests_5m", "tiers", "pinned", "reported", "ceilings"]

    def get_gpu_used(self, node: Node) -> int:
        """Adapters in GPU slots."""
        return slots_used(node.state or {})[0]

    def get_cpu_used(self, node: Node) -> int:
        """Adapters in the engine's CPU cache, those in GPU slots included (vLLM's ``max_cpu_loras`` counts them)."""
        return slots_used(node.state or {})[1]

    def get_num_preemptions_total(self, node: Node) -> float | None:
        """vLLM's ``num_preemptions_total`` counter from the last heartbeat."""
        value = (node.state or {}).get("num_preemptions_total")
        return float(value) if isinstance(value, (int, float)) else None

    def get_failed_requests_5m(self, node: Node) -> int:
        """Requests the node answered with status >= 500 in the last 5 minutes."""
        # A list sets ``failed_requests_5m`` for its whole page in one grouped query; a single node counts its own.
        failed = getattr(node, "failed_requests_5m", None)
        if failed is None:
            failed = node_failures(node_ids=[node.pk], since=failures_since())[node.pk]
        return int(failed)

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

    @extend_schema_field(_CAPACITY_SCHEMA)
    def get_reported(self, node: Node) -> dict[str, int | None]:
        """The capacity the node's last heartbeat claimed, by field (null: not said)."""
        state = node.state or {}
        return {f: state[f] if isinstance(state.get(f), int) else None for f in CAPACITY_FIELDS}

    @extend_schema_field(_CAPACITY_SCHEMA)
    def get_ceilings(self, node: Node) -> dict[str, int | None]:
        """The node's capacity ceilings by field (null: none)."""
        return node_ceilings(node)


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
    """``GET /api/v1/operator/nodes``: a page of nodes with their residency counts (four queries: the count, the
    page, the page's placements counted per tier, the page's failures counted per node);
    ``GET /api/v1/operator/nodes/{name}/samples``: its gauges over time."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = NodeOutputSerializer
    pagination_class = BoundedPage
    lookup_field = "name"
    queryset = Node.objects.all()

    def get_queryset(self) -> QuerySet[Node]:
        """Nodes by name."""
        return Node.objects.select_related("base_model").order_by("name")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A page of nodes (``?limit=`` default 50, at most 200; ``?offset=``), by name."""
        page = self.paginate_queryset(self.get_queryset())
        nodes = list(page if page is not None else self.get_queryset())
        ids = [n.pk for n in nodes]
        # Both counts are one grouped query for the page (a correlated count per node was one scan per node).
        counts = node_residency_counts(node_ids=ids)
        failures = node_failures(node_ids=ids, since=failures_since())
        for node in nodes:  # read by the serializer
            node.residency_counts = counts[node.pk]  # type: ignore[attr-defined]
            node.failed_requests_5m = failures[node.pk]  # type: ignore[attr-defined]
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


class OperatorTrafficQuerySerializer(TrafficQuerySerializer):
    """Query of ``GET /api/v1/operator/traffic``: the tenant table's (``since``, ``until``, ``bucket``, ``tenant``)
    and ``ordering``, besides the page's ``limit`` and ``offset``."""

    ordering = serializers.ChoiceField(
        choices=[f"{sign}{name}" for name in ORDERINGS for sign in ("-", "")], required=False, default="-requests",
        help_text="a row field, '-' for descending (default '-requests'); ties by tenant, model, version")


class OperatorTrafficViewSet(viewsets.GenericViewSet):
    """``GET /api/v1/operator/traffic``: every tenant's traffic per adapter version (staff sessions), a page at a
    time."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    serializer_class = TrafficRowSerializer
    pagination_class = BoundedPage
    queryset = UsageRecord.objects.all()

    @extend_schema(parameters=[OperatorTrafficQuerySerializer], responses=TrafficRowSerializer(many=True))
    def list(self, request: Request) -> Response:
        """A page of rows (``?limit=`` default 50, at most 200; ``?offset=``) in ``?ordering=`` (most requests
        first by default), each version on exactly one page. The order comes from every version's totals (one
        grouped read); the latency and TTFT percentiles are computed for the page's versions only, over the same
        records as the whole table's (``inference.metering.traffic.with_percentiles``). Hourly sparklines (periods
        over 6 h) read the whole final hours from the hourly sums, as the tenant's table does: a day of every tenant
        is otherwise every record of the day. 400 with ``fields`` for a bad period, bucket, tenant or ordering."""
        query = OperatorTrafficQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        drain_quietly()
        records, hours = self.get_queryset(), UsageHour.objects.all()
        if q.get("tenant"):
            records, hours = records.filter(tenant__slug=q["tenant"]), hours.filter(tenant__slug=q["tenant"])
        totals = traffic_totals(records, since=q["since"], until=q["until"], bucket=q["bucket"], hours=hours)
        page = self.paginate_queryset(order_rows(totals.rows, q["ordering"]))  # type: ignore[arg-type]  # a list
        return self.get_paginated_response(with_percentiles(page or [], totals.scoped))
