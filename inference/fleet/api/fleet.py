"""Fleet API: operator actions (staff sessions) and tenants' read-only residency counts.

Operator (every action writes a ``FleetAuditRecord``; errors are ``{"detail", "code"}``):
- ``POST /api/v1/operator/versions/{id}/pin`` ``{"node": name | null}`` (null = every node holding it);
  ``POST …/unpin`` the same; ``PUT …/replicas`` ``{"min_replicas", "max_replicas"}``; ``GET …/{id}`` the intent.
- ``POST /api/v1/operator/placements/{id}/evict``: remove from that node's engine now.
- ``GET|PUT /api/v1/operator/residency-quotas/{tenant_slug}`` ``{"max_pinned", "max_gpu_bytes"}``.
- ``GET /api/v1/operator/audit``: the latest 500 records.
Tenant: ``GET /api/v1/residency``: per version, replicas per tier and pinned count; never node names.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from adapters_app.models import AdapterVersion
from inference.fleet import services as svc
from inference.fleet.api.operator import OPERATOR_AUTHENTICATION, IsStaffSession
from inference.fleet.models import FleetAuditRecord, Node, Placement, TenantResidencyQuota
from tenants.models import Tenant
from tenants.viewsets import TenantScopedViewSet


class IntentSerializer(serializers.Serializer):
    """A version's desired state."""

    version_id = serializers.IntegerField(source="adapter_version_id")
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField(allow_null=True)
    pinned_fleet = serializers.BooleanField()
    pinned_nodes = serializers.ListField(child=serializers.CharField())


class PinInputSerializer(serializers.Serializer):
    """Which node to pin on or unpin from; null = every node holding the version."""

    node = serializers.CharField(required=False, allow_null=True, default=None)


class ReplicasInputSerializer(serializers.Serializer):
    """Replica bounds: ``1 ≤ min_replicas ≤ max_replicas``; ``max_replicas`` null = the placement default."""

    min_replicas = serializers.IntegerField(min_value=1, max_value=64)
    max_replicas = serializers.IntegerField(min_value=1, max_value=64, allow_null=True, default=None)


class QuotaSerializer(serializers.Serializer):
    """A tenant's residency quota; null = no limit."""

    max_pinned = serializers.IntegerField(min_value=0, max_value=2**31 - 1, allow_null=True, default=None)
    max_gpu_bytes = serializers.IntegerField(min_value=0, max_value=2**63 - 1, allow_null=True, default=None)


class AuditSerializer(serializers.ModelSerializer):
    """One operator action."""

    class Meta:
        model = FleetAuditRecord
        fields = ["id", "actor", "action", "target", "before", "after", "created_at"]


class ResidencyRowSerializer(serializers.Serializer):
    """One version's replicas per tier (``hot`` GPU, ``warm`` CPU, ``staged`` disk, ``cold``, ``errored``)."""

    adapter = serializers.CharField()
    version = serializers.IntegerField()
    tiers = serializers.DictField(child=serializers.IntegerField())
    pinned = serializers.IntegerField()


def _error(exc: svc.FleetActionError) -> Response:
    return Response({"detail": exc.detail, "code": exc.code}, status=exc.status)


def _actor(request: Request) -> str:
    return str(request.user.get_username())


def _node(name: str | None) -> Node | None:
    if name is None:
        return None
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise svc.FleetActionError(404, "node_not_found", f"No node named {name!r}.")
    return node


class OperatorViewSet(viewsets.GenericViewSet):
    """Staff sessions only."""

    authentication_classes = OPERATOR_AUTHENTICATION
    permission_classes = [IsStaffSession]
    pagination_class = None


class OperatorVersionViewSet(mixins.RetrieveModelMixin, OperatorViewSet):
    """Desired state of one adapter version."""

    queryset = AdapterVersion.objects.select_related("adapter__tenant", "adapter__base_model")
    serializer_class = IntentSerializer

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """``GET /api/v1/operator/versions/{id}``: its intent."""
        return Response(IntentSerializer(svc.version_intent_get(self.get_object())).data)

    def _pin(self, request: Request, pin: bool) -> Response:
        body = PinInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            fn = svc.version_pin if pin else svc.version_unpin
            intent = fn(self.get_object(), node=_node(body.validated_data["node"]), actor=_actor(request))
        except svc.FleetActionError as exc:
            return _error(exc)
        return Response(IntentSerializer(intent).data)

    @extend_schema(request=PinInputSerializer, responses=IntentSerializer)
    @action(detail=True, methods=["post"])
    def pin(self, request: Request, pk: str | None = None) -> Response:
        """Pin on a node (or fleet-wide); at most ``max_loras − 1`` pins per node."""
        return self._pin(request, True)

    @extend_schema(request=PinInputSerializer, responses=IntentSerializer)
    @action(detail=True, methods=["post"])
    def unpin(self, request: Request, pk: str | None = None) -> Response:
        """Unpin on a node (or everywhere)."""
        return self._pin(request, False)

    @extend_schema(request=ReplicasInputSerializer, responses=IntentSerializer)
    @action(detail=True, methods=["put"])
    def replicas(self, request: Request, pk: str | None = None) -> Response:
        """Set min/max replicas."""
        body = ReplicasInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            intent = svc.version_replicas_set(self.get_object(), actor=_actor(request), **body.validated_data)
        except svc.FleetActionError as exc:
            return _error(exc)
        return Response(IntentSerializer(intent).data)


class OperatorPlacementViewSet(OperatorViewSet):
    """Act on one observed placement."""

    queryset = Placement.objects.select_related("node", "adapter_version__adapter__tenant")
    serializer_class = serializers.Serializer

    @extend_schema(request=None, responses={202: None})
    @action(detail=True, methods=["post"])
    def evict(self, request: Request, pk: str | None = None) -> Response:
        """``POST /api/v1/operator/placements/{id}/evict``: remove it from that engine now (202; next heartbeat shows it)."""
        try:
            svc.placement_evict_now(self.get_object(), actor=_actor(request))
        except svc.FleetActionError as exc:
            return _error(exc)
        return Response(status=202)


class OperatorQuotaViewSet(mixins.RetrieveModelMixin, mixins.UpdateModelMixin, OperatorViewSet):
    """A tenant's residency quota, by tenant slug."""

    queryset = Tenant.objects.all()
    lookup_field = "slug"
    serializer_class = QuotaSerializer

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """``GET /api/v1/operator/residency-quotas/{slug}``."""
        quota = TenantResidencyQuota.objects.filter(tenant=self.get_object()).first()
        return Response(QuotaSerializer(quota).data if quota else {"max_pinned": None, "max_gpu_bytes": None})

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """``PUT /api/v1/operator/residency-quotas/{slug}``."""
        body = QuotaSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        quota = svc.tenant_residency_quota_set(self.get_object(), actor=_actor(request), **body.validated_data)
        return Response(QuotaSerializer(quota).data)


class OperatorAuditViewSet(mixins.ListModelMixin, OperatorViewSet):
    """``GET /api/v1/operator/audit``: the latest 500 fleet actions, newest first."""

    queryset = FleetAuditRecord.objects.order_by("-created_at", "-id")[:500]
    serializer_class = AuditSerializer


class ResidencyViewSet(TenantScopedViewSet):
    """The caller's adapters: replicas per tier (no node names)."""

    queryset = Placement.objects.all()
    tenant_field = "adapter_version__tenant"
    serializer_class = ResidencyRowSerializer
    pagination_class = None

    @extend_schema(responses=ResidencyRowSerializer(many=True))
    def list(self, request: Request) -> Response:
        """``GET /api/v1/residency``."""
        return Response(svc.tenant_residency(self.tenant, adapter_names=self.key_adapter_names))
