"""Operator node registry (staff sessions), beside ``manage.py quiver_node_register``, on ``/api/v1/operator/nodes``:

- ``POST /api/v1/operator/nodes`` ``{"name", "agent_url", "engine_url", "base_model"}``: register a node; the answer
  carries its credentials, the only time the API shows them (409 ``node_exists`` for a registered name).
- ``GET …/{name}``: one registered node (as in the list; never a credential).
- ``POST …/{name}/rotate``: new credentials, shown once; the old pair stops working at once.
- ``DELETE …/{name}``: deregister (credentials revoked, placements dropped, gone from routing).
Every change writes a ``FleetAuditRecord`` (never the credentials). Errors are ``{"detail", "code"}``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from inference.fleet.api.operator import NodeViewSet
from inference.fleet.models import FleetAuditRecord, Node
from inference.fleet.node_keys import NodeCredentials
from inference.fleet.nodes import NodeRefused, node_deregister, node_register
from inference.policy.node_capacity import CAPACITY_FIELDS, MAX_CEILING


class NodeRegisterInputSerializer(serializers.Serializer):
    """A node to register: its name, the URLs the control plane reaches it at, the base model it serves, and
    optionally its capacity ceilings (``max_loras``, ``max_cpu_loras``, ``max_lora_rank``: the most of each its
    heartbeats may claim; absent or null: the fleet's, ``inference.policy.node_capacity``)."""

    name = serializers.CharField(max_length=63)
    agent_url = serializers.CharField(max_length=300)
    engine_url = serializers.CharField(max_length=300)
    base_model = serializers.CharField(max_length=200)
    max_loras = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CEILING)
    max_cpu_loras = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CEILING)
    max_lora_rank = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CEILING)


class NodeCredentialsSerializer(serializers.Serializer):
    """The node's credentials as the env lines its agent and engine take (``VLLM_API_KEY`` = ``QUIVER_NODE_KEY``)."""

    QUIVER_NODE_NAME = serializers.CharField()
    QUIVER_NODE_KEY = serializers.CharField()
    QUIVER_NODE_TOKEN = serializers.CharField()


class NodeRegisteredSerializer(serializers.Serializer):
    """A registration or rotation: the node and, this once, its credentials."""

    name = serializers.CharField()
    base_model = serializers.CharField()
    agent_url = serializers.CharField()
    engine_url = serializers.CharField()
    key_generation = serializers.IntegerField()
    credentials = NodeCredentialsSerializer()


def _registered(node: Node, creds: NodeCredentials) -> dict[str, Any]:
    return {"name": node.name, "base_model": node.base_model.base_model_name if node.base_model else "",
            "agent_url": node.agent_url, "engine_url": node.engine_url, "key_generation": node.key_generation,
            "credentials": {"QUIVER_NODE_NAME": creds.name, "QUIVER_NODE_KEY": creds.key,
                            "QUIVER_NODE_TOKEN": creds.token}}


def _audit(request: Request, action_name: str, node: Node, before: dict[str, Any]) -> None:
    after = {"agent_url": node.agent_url, "engine_url": node.engine_url, "key_generation": node.key_generation,
             "deregistered": node.deregistered_at is not None}
    FleetAuditRecord.objects.create(actor=str(request.user.get_username()), action=action_name,
                                    target=f"node/{node.name}", before=before, after=after)


def _refused(exc: NodeRefused) -> Response:
    return Response({"detail": exc.detail, "code": exc.code}, status=exc.status)


class NodeRegistryViewSet(mixins.RetrieveModelMixin, NodeViewSet):
    """The operator node view (list, samples) plus retrieve, register, rotate and deregister; deregistered nodes
    are neither listed nor found."""

    lookup_value_regex = "[a-z0-9-]+"

    def get_queryset(self) -> QuerySet[Node]:
        """Registered nodes only."""
        return super().get_queryset().filter(deregistered_at=None)

    @extend_schema(request=NodeRegisterInputSerializer, responses={201: NodeRegisteredSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Register a node; 409 ``node_exists`` when the name is registered (rotate or deregister it first)."""
        body = NodeRegisterInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        with transaction.atomic():
            existing = Node.objects.select_for_update().filter(name=data["name"]).first()
            if existing is not None and existing.deregistered_at is None:
                return Response({"detail": f"Node {data['name']!r} is already registered; POST …/{data['name']}/rotate "
                                 "for new credentials, or DELETE it first to change its URLs.", "code": "node_exists"},
                                status=status.HTTP_409_CONFLICT)
            try:
                node, creds = node_register(name=data["name"], agent_url=data["agent_url"],
                                            engine_url=data["engine_url"], base_model_name=data["base_model"],
                                            ceilings={f: data.get(f) for f in CAPACITY_FIELDS})
            except NodeRefused as exc:
                return _refused(exc)
            _audit(request, "node_register", node, {"key_generation": existing.key_generation} if existing else {})
        return Response(_registered(node, creds), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=NodeRegisteredSerializer)
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, name: str | None = None) -> Response:
        """New credentials for the node (shown once); the old key and token stop working now."""
        node = self.get_object()
        before = {"key_generation": node.key_generation}
        try:
            with transaction.atomic():
                node, creds = node_register(name=node.name, agent_url=node.agent_url, engine_url=node.engine_url,
                                            base_model_name=node.base_model.base_model_name if node.base_model else "",
                                            rotate=True)
                _audit(request, "node_rotate", node, before)
        except NodeRefused as exc:  # its base model was deleted: register it again for one that exists
            return _refused(exc)
        return Response(_registered(node, creds))

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Deregister the node: credentials revoked, placements dropped, out of routing."""
        node = self.get_object()
        with transaction.atomic():
            node = node_deregister(node)
            _audit(request, "node_deregister", node, {"key_generation": node.key_generation - 1})
        return Response(status=status.HTTP_204_NO_CONTENT)
