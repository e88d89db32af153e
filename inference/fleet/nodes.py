"""The node registry: operators register nodes with their URLs; heartbeats are accepted only from the node itself.

A heartbeat is authenticated by the node's own token (``inference.fleet.node_keys``), may not claim another
node's name, other URLs or another base model, and its figures are validated (``inference.fleet.heartbeat``)
before anything is written. Anything refused changes nothing.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.purge import purge_node_orphans
from inference.fleet.heartbeat import HeartbeatInvalid, heartbeat_parse
from inference.fleet.models import RESIDENT, Node, Placement, VersionIntent
from inference.fleet.node_keys import NodeCredentials, node_credentials, token_matches, token_node_name
from inference.fleet.node_samples import node_sample_record

logger = logging.getLogger(__name__)
# (node id, version id) pairs already logged as claimed unasked; bounded, oldest forgotten first.
_UNASKED_LOGGED: OrderedDict[tuple[int, int], None] = OrderedDict()
_UNASKED_LOGGED_MAX = 10_000
_UNASKED_LOCK = threading.Lock()
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


def nodes_live(base_model: BaseModel) -> QuerySet[Node]:
    """Healthy nodes serving ``base_model`` whose last heartbeat is within ``QUIVER_NODE_STALE_AFTER_S``."""
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(base_model=base_model, healthy=True, last_heartbeat_at__gte=fresh)


def node_heartbeat(*, node: Node, state: Mapping[str, Any]) -> Node:
    """Record an authenticated, validated state report of ``node`` and reconcile its placements.

    Callers go through ``inference.fleet.nodes.node_heartbeat_accept``, which checks the token, the identity, the
    URLs and every figure first; the node's name, URLs and base model are never taken from the report.

    Args:
        node: the registered node the heartbeat's token belongs to.
        state: the agent's ``GET /v1/state`` JSON (``healthy``, ``adapters`` [{``lora_name``, ``lora_int_id``,
            ``tier``, ``pinned``, ``served``}], capacities, KV and queue gauges).

    Returns:
        The node. Only versions that exist, serve this node's base model, carry their own served name and that the
        control plane asked this node to load (``Placement.load_issued_at``, set by a warm or a pin) are recorded;
        versions the node no longer reports drop to ``cold`` on it (a pin naming the node keeps its mark there).
        A row written since the node's previous heartbeat (a load or an evict meanwhile) takes nothing from this
        report, which may predate the write, but news that a load it asked for is resident. A version claimed without having been asked
        for is ignored (its requests never go there) and logged once per node and version
        (``node.heartbeat_unasked_version``).
    """
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        if locked.key_generation != node.key_generation or locked.deregistered_at is not None:
            return locked  # rotated or deregistered between authenticating this heartbeat and now: write nothing
        node = locked
        previous = node.last_heartbeat_at
        node.healthy = bool(state.get("healthy"))
        now = node.last_heartbeat_at = timezone.now()
        node.max_loras = state.get("max_loras") or 0
        node.max_cpu_loras = state.get("max_cpu_loras") or 0
        node.max_lora_rank = state.get("max_lora_rank") or 0
        node.kv_cache_usage_perc = state.get("kv_cache_usage_perc")
        node.num_requests_running = state.get("num_requests_running")
        node.num_requests_waiting = state.get("num_requests_waiting")
        node.state = {k: v for k, v in state.items() if k not in ("agent_url", "engine_url")}
        node.save()
        node_sample_record(node=node, state=state, now=node.last_heartbeat_at)
        reported = {a["lora_int_id"]: a for a in state.get("adapters", [])}
        # Known versions only: the id exists, is for this node's base model, and the name is that version's own.
        versions = list(AdapterVersion.objects.select_related("adapter__tenant").filter(pk__in=reported))
        owned = {v.pk for v in versions if reported[v.pk].get("lora_name") == v.served_name}
        ours = {v.pk for v in versions if v.pk in owned and v.adapter.base_model_id == node.base_model_id}
        # A copy no version owns (deleted while the node was away, or never ours) is garbage on that node (bounded
        # per report: the names come from the node).
        purge_node_orphans(node.pk, [e["lora_name"] for v, e in reported.items() if v not in owned])
        # Only what this node was asked to load: the token proves which node speaks, not that it was given the
        # version. Rows persist across control-plane restarts (PostgreSQL), and an engine that reloads a name it
        # still serves from disk, a pin or an evict all act on a row that a warm already marked.
        current = {p.adapter_version_id: p for p in Placement.objects.filter(
            node=node, adapter_version_id__in=ours, load_issued_at__isnull=False)}
        # The agent sends one heartbeat at a time, so this report was built after the previous one was recorded
        # (``previous``): it may predate only what changed on a row since then (``newer``), such as a warm that
        # finished, or an evict, while the report was on its way. Until the next report such a row takes from this
        # one only that a load it asked for is resident (``_may_predate``). This heartbeat stamps its own writes
        # ``now``, so they never count as newer; other writers use the control plane's clock too.
        newer = set() if previous is None else set(Placement.objects.filter(
            node=node, updated_at__gt=previous).values_list("adapter_version_id", flat=True))
        known = set(current)
        for version in versions:
            if version.pk in ours and version.pk not in known:
                _log_unasked_claim(node, version, reported[version.pk])
        # An operator's pin keeps its row's mark until the engine reports it: the mark counts against the node's pin
        # bound (services.node_pins), and a heartbeat between a pin and its warm must not free that room.
        pins = list(VersionIntent.objects.filter(adapter_version__placements__node=node).filter(
            Q(pinned_fleet=True) | ~Q(pinned_nodes=[])).values_list("adapter_version_id", "pinned_fleet", "pinned_nodes"))
        intended = {vid for vid, fleet, names in pins if vid in known and (fleet or node.name in names)}
        named_here = {vid for vid, _, names in pins if node.name in names}
        for version_id in known:
            entry = reported[version_id]
            tier = entry["tier"]
            row = current[version_id]
            if version_id in newer and _may_predate(row, tier, previous):
                continue
            pinned = bool(entry.get("pinned")) or (row.pinned and (version_id in intended or version_id in newer))
            wanted = {"tier": tier, "pinned": pinned,
                      "served": bool(entry.get("served", tier in RESIDENT)), "warming_since": None}
            if row.warming_since is not None and tier not in RESIDENT:
                # A warm in flight keeps its mark until the node reports the version resident or the warm task
                # records its outcome: cleared here, the row's previous failure would answer the waiting request.
                del wanted["warming_since"]
            # Heartbeats come every few seconds: write only what changed.
            if any(getattr(row, k) != v for k, v in wanted.items()):
                Placement.objects.filter(pk=row.pk).update(**wanted, updated_at=now)
        # Only rows the node once held drop to cold; in-flight warms keep their state. A pin naming this node keeps
        # its mark: the report may predate the pinned load (built before the load finished, received after it), and
        # the reconciler reloads a named pin that really went. A fleet pin covers only nodes holding the version, so
        # its mark goes with the copy (kept, it would hold pin room that nothing clears).
        dropped = Placement.objects.filter(
            node=node, tier__in=[*RESIDENT, Placement.Tier.STAGED], warming_since=None).exclude(
            adapter_version_id__in=known | newer)
        dropped.filter(adapter_version_id__in=named_here).update(tier=Placement.Tier.COLD, served=False)
        dropped.exclude(adapter_version_id__in=named_here).update(tier=Placement.Tier.COLD, pinned=False, served=False)
    return node


def _may_predate(row: Placement, tier: str, previous: datetime | None) -> bool:
    """Whether a report of ``tier`` for ``row``, a row written since the node's previous heartbeat (recorded at
    ``previous``), may describe the node before that write: any word but resident may predate a load, and resident
    may predate an evict unless a load is in flight or was issued since ``previous`` (the node may answer a load's
    copy in a report sent before the load call returns)."""
    if tier not in RESIDENT:
        return True
    loading = row.warming_since is not None or (
        previous is not None and row.load_issued_at is not None and row.load_issued_at > previous)
    return row.tier not in RESIDENT and not loading


def _log_unasked_claim(node: Node, version: AdapterVersion, entry: Mapping[str, Any]) -> None:
    """Log, once per (node, version) in this process, a heartbeat claiming a version the node was never asked to
    load (a forged report, or copies left from before the node was deregistered); heartbeats repeat every second."""
    key = (node.pk, version.pk)
    with _UNASKED_LOCK:
        if key in _UNASKED_LOGGED:
            return
        _UNASKED_LOGGED[key] = None
        while len(_UNASKED_LOGGED) > _UNASKED_LOGGED_MAX:
            _UNASKED_LOGGED.popitem(last=False)
    logger.warning("node.heartbeat_unasked_version", extra={
        "node": node.name, "version_id": version.pk, "tenant": version.adapter.tenant.slug,
        "tier": entry.get("tier"), "served": entry.get("served"), "action": "ignored"})


def node_mark_stale() -> int:
    """Mark nodes without a recent heartbeat unhealthy; returns how many changed."""
    cutoff = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(healthy=True, last_heartbeat_at__lt=cutoff).update(healthy=False)
