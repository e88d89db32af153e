"""The node registry: operators register nodes with their URLs; heartbeats are accepted only from the node itself.

A heartbeat is authenticated by the node's own token (``inference.gateway.node_keys``), may not claim another
node's name, other URLs or another base model, and its figures are validated (``inference.gateway.heartbeat``)
before anything is written. Anything refused changes nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from adapters_app.models import BaseModel
from inference.gateway.heartbeat import HeartbeatInvalid, heartbeat_parse
from inference.gateway.models import Node, Placement
from inference.gateway.node_keys import NodeCredentials, node_credentials, token_matches, token_node_name
from inference.gateway.placement import node_heartbeat

logger = logging.getLogger(__name__)
NODE_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def _is_base_url(value: str) -> bool:
    # Single-label hosts (compose service names) are fine; Django's URLValidator refuses them.
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.username
            and not parts.query and not parts.fragment)


class NodeRefused(Exception):
    """A registration or heartbeat was refused: ``status``, stable ``code`` and a message naming the fix."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def node_register(*, name: str, agent_url: str, engine_url: str, base_model_name: str,
                  rotate: bool = False) -> tuple[Node, NodeCredentials]:
    """Register node ``name`` (or change its URLs and base model) and return its credentials.

    Re-registering keeps the node's credentials unless ``rotate``, which moves it to a new key generation: the old
    key and token stop working and the node is unhealthy until it heartbeats with the new ones. Registering a
    deregistered name always moves to a new generation. Re-registering for another base model drops the node's
    placements and makes it unhealthy until a heartbeat reports that model.

    Raises:
        NodeRefused: 400 ``invalid`` (name not 1-63 lowercase letters, digits or hyphens; a URL not http(s)),
            400 ``base_model_not_found``.
    """
    if not NODE_NAME_RE.match(name):
        raise NodeRefused(400, "invalid", f"Node name {name!r}: use 1-63 lowercase letters, digits or hyphens.")
    for field, value in (("agent_url", agent_url), ("engine_url", engine_url)):
        if not _is_base_url(value):
            raise NodeRefused(400, "invalid", f"{field} {value!r} is not an http(s) base URL such as "
                              "http://node-agent:8100 (no credentials, query or fragment).")
    base = BaseModel.objects.filter(base_model_name=base_model_name).first()
    if base is None:
        raise NodeRefused(400, "base_model_not_found",
                          f"Unknown base model {base_model_name!r}; register it first (quiver_base_model_register).")
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            node = Node(name=name, key_generation=1)
        elif rotate or node.deregistered_at is not None:
            node.key_generation += 1
            node.healthy = False
        if node.pk is not None and node.base_model_id != base.pk:
            # Another base model: what it held was for the old one. Unhealthy until its engine reports the new model
            # (the heartbeat refuses a mismatch), so no queued warm or routed request sends it the old model's adapters.
            node.healthy = False
            node.state = {}
            Placement.objects.filter(node=node).delete()
        node.deregistered_at = None
        node.agent_url, node.engine_url = agent_url.rstrip("/"), engine_url.rstrip("/")
        node.base_model = base
        node.registered_at = timezone.now()
        node.save()
    logger.info("node.registered", extra={"node": name, "generation": node.key_generation, "rotated": rotate})
    return node, node_credentials(name, node.key_generation)


def node_deregister(node: Node) -> Node:
    """Take ``node`` out of the fleet: its credentials stop working (new key generation, never issued), it is
    unhealthy, and its placements are dropped so nothing routes to it. The row stays (see ``Node.deregistered_at``);
    whatever the node still holds goes with the machine. Idempotent.
    """
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.deregistered_at is None:
            node.key_generation += 1
            node.healthy = False
            node.deregistered_at = timezone.now()
            node.save(update_fields=["key_generation", "healthy", "deregistered_at"])
            Placement.objects.filter(node=node).delete()
    logger.info("node.deregistered", extra={"node": node.name, "generation": node.key_generation})
    return node


def node_heartbeat_accept(*, token: str, body: Any) -> Node:
    """Authenticate and validate one heartbeat, then record it (``placement.node_heartbeat``).

    Args:
        token: the bearer token sent (the node's heartbeat token).
        body: the decoded JSON body (the agent's state report).

    Returns:
        The node, updated.

    Raises:
        NodeRefused: 401 ``invalid_node_token`` (unknown node or wrong token); 400 ``invalid`` (a bad figure; the
            message names the field); 403 ``node_identity_mismatch`` (the body names another node); 409
            ``node_urls_changed`` or ``base_model_mismatch`` (URLs and base model are fixed at registration).
    """
    name = token_node_name(token)
    node = Node.objects.select_related("base_model").filter(name=name).first() if name else None
    if node is None or not token_matches(token, node.name, node.key_generation):
        raise NodeRefused(401, "invalid_node_token", "Invalid node token; use the one quiver_node_register printed.")
    try:
        state, _ = heartbeat_parse(body, tiers=Placement.Tier.values)
    except HeartbeatInvalid as exc:
        raise NodeRefused(400, "invalid", f"Invalid heartbeat field {exc.field}: {exc.message}.") from exc
    if state["node"] != node.name:
        logger.warning("node.heartbeat_identity_mismatch", extra={"node": node.name, "claimed": state["node"]})
        raise NodeRefused(403, "node_identity_mismatch",
                          f"This token belongs to node {node.name!r}, not {state['node']!r}.")
    for field in ("agent_url", "engine_url"):
        claimed = state.get(field)
        if claimed and claimed.rstrip("/") != getattr(node, field):
            logger.warning("node.heartbeat_urls_changed", extra={"node": node.name, "field": field})
            raise NodeRefused(409, "node_urls_changed", f"{field} is fixed at registration ({getattr(node, field)}); "
                              "re-register the node with quiver_node_register to change it.")
    registered_base = node.base_model.base_model_name if node.base_model else None
    if state.get("base_model") is not None and state["base_model"] != registered_base:
        raise NodeRefused(409, "base_model_mismatch",
                          f"Node {node.name!r} is registered for base model {registered_base!r}, "
                          f"not {state['base_model']!r}; re-register it to change.")
    return node_heartbeat(node=node, state=state)


def node_credentials_of(node: Node) -> NodeCredentials:
    """The current credentials of a registered node (for calls to its agent and engine)."""
    return node_credentials(node.name, node.key_generation)


def node_state_public(state: Mapping[str, Any]) -> dict[str, Any]:
    """The stored copy of a heartbeat: the body without the URLs it may repeat (the registry holds those)."""
    return {k: v for k, v in state.items() if k not in ("agent_url", "engine_url")}
