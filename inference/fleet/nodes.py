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
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from adapters_app.models import AdapterVersion, BaseModel, served_name
from adapters_app.purge import purge_node_orphans
from common.bus import invalidation_publish_on_commit
from inference.fleet.heartbeat import HeartbeatInvalid, heartbeat_parse
from inference.fleet.models import RESIDENT, Node, NodeSample, Placement
from inference.fleet.node_keys import NodeCredentials, node_credentials, token_matches, token_node_name
from inference.fleet.node_samples import node_sample_after
from inference.policy.node_capacity import (
    CAPACITY_FIELDS,
    NodeCapacity,
    capacity_effective,
    ceilings_check,
    ceilings_resolve,
)
from inference.policy.node_report import PlacementRow, ReportedAdapter, report_changes, report_digest

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
                  rotate: bool = False, ceilings: Mapping[str, int | None] | None = None) -> tuple[Node, NodeCredentials]:
    """Register node ``name`` (or change its URLs, base model or capacity ceilings) and return its credentials.

    ``ceilings``: the node's own capacity ceilings by field (``max_loras``, ``max_cpu_loras``, ``max_lora_rank``);
    None sets a field back to the fleet's default, an absent field keeps what the node had (a new node: the
    default). The figures placement and routing use are the heartbeat's clamped to them (``node_ceilings``),
    applied at once to the node's last report.

    Re-registering keeps the node's credentials unless ``rotate``, which moves it to a new key generation: the old
    key and token stop working and the node is unhealthy until it heartbeats with the new ones. Registering a
    deregistered name always moves to a new generation. Re-registering for another base model drops the node's
    placements and makes it unhealthy until a heartbeat reports that model.

    Raises:
        NodeRefused: 400 ``invalid`` (name not 1-63 lowercase letters, digits or hyphens; a URL not http(s)),
            400 ``base_model_not_found``; 400 ``invalid`` naming the ceiling (not an integer in [1, 2**31 - 1], or a
            ``max_cpu_loras`` ceiling below the ``max_loras`` one, the node's or the fleet's).
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
    unknown = set(ceilings or ()) - set(CAPACITY_FIELDS)
    if unknown:
        raise NodeRefused(400, "invalid", f"Unknown capacity ceiling {sorted(unknown)[0]!r}; use {CAPACITY_FIELDS}.")
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            node = Node(name=name, key_generation=1)
        elif rotate or node.deregistered_at is not None:
            node.key_generation += 1
            node.healthy = False
        for field, ceiling in (ceilings or {}).items():
            setattr(node, f"{field}_ceiling", ceiling)
        try:
            ceilings_check(ceilings_resolve(_own_ceilings(node), _fleet_ceilings(None)))
        except ValueError as exc:  # raised out of the transaction: nothing of this registration is written
            field, message = exc.args
            raise NodeRefused(400, "invalid", f"{field} ceiling (--{field.replace('_', '-')}): {message}.") from exc
        if node.pk is not None and node.base_model_id != base.pk:
            # Another base model: what it held was for the old one. Unhealthy until its engine reports the new model
            # (the heartbeat refuses a mismatch), so no queued warm or routed request sends it the old model's adapters.
            node.healthy = False
            node.state, node.residency_digest = {}, ""
            Placement.objects.filter(node=node).delete()
        node.deregistered_at = None
        node.agent_url, node.engine_url = agent_url.rstrip("/"), engine_url.rstrip("/")
        node.base_model = base
        node.registered_at = timezone.now()
        if node.state:  # new ceilings apply to the last report now, not at the next heartbeat
            capacity = capacity_effective(node.state, node_ceilings(node))
            node.max_loras, node.max_cpu_loras = capacity.max_loras, capacity.max_cpu_loras
            node.max_lora_rank = capacity.max_lora_rank
            _log_clamps(node, capacity, previous={})
        node.save()
    logger.info("node.registered", extra={"node": name, "generation": node.key_generation, "rotated": rotate,
                                          **{f"{f}_ceiling": getattr(node, f"{f}_ceiling") for f in CAPACITY_FIELDS}})
    return node, node_credentials(name, node.key_generation)


def _own_ceilings(node: Node) -> dict[str, int | None]:
    return {field: getattr(node, f"{field}_ceiling") for field in CAPACITY_FIELDS}


def _fleet_ceilings(base_model: BaseModel | None) -> dict[str, int | None]:
    return {"max_loras": settings.QUIVER_NODE_MAX_LORAS_CEILING,
            "max_cpu_loras": settings.QUIVER_NODE_MAX_CPU_LORAS_CEILING,
            "max_lora_rank": base_model.max_lora_rank if base_model is not None else None}


def node_ceilings(node: Node) -> dict[str, int | None]:
    """The capacity ceilings of ``node`` by field: its operator-set ones, else the fleet's
    (``QUIVER_NODE_MAX_LORAS_CEILING``, ``QUIVER_NODE_MAX_CPU_LORAS_CEILING``, its base model's ``max_lora_rank``;
    None: no base model, no rank ceiling)."""
    return ceilings_resolve(_own_ceilings(node), _fleet_ceilings(node.base_model))


def _log_clamps(node: Node, capacity: NodeCapacity, *, previous: Mapping[str, Any]) -> None:
    """Log each figure ``node`` reports above its ceiling once, when it starts to (``previous``: the node's last
    stored report, whose figure was within the ceiling), not on every heartbeat that repeats it."""
    for clamp in capacity.clamped:
        if int(previous.get(clamp.field) or 0) > clamp.ceiling:
            continue
        logger.warning("node.capacity_clamped", extra={"node": node.name, "field": clamp.field,
                                                       "reported": clamp.reported, "ceiling": clamp.ceiling})


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
            node.residency_digest = ""
            node.save(update_fields=["key_generation", "healthy", "deregistered_at", "residency_digest"])
            Placement.objects.filter(node=node).delete()
    logger.info("node.deregistered", extra={"node": node.name, "generation": node.key_generation})
    return node


def node_heartbeat_accept(*, token: str, body: Any) -> Node:
    """Authenticate and validate one heartbeat, then record it as ``node_heartbeat`` does, under the node row's lock
    taken to authenticate (one query also reads the node's last sample time).

    Args:
        token: the bearer token sent (the node's heartbeat token).
        body: the decoded JSON body (the agent's state report), or a function returning it, called only once the
            token and the heartbeat floor passed.

    Returns:
        The node, updated.

    Raises:
        NodeRefused: 401 ``invalid_node_token`` (unknown node or wrong token); 429 ``heartbeat_too_soon`` (within
            ``QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S`` of the node's last one); 400 ``invalid`` (a bad figure; the
            message names the field); 403 ``node_identity_mismatch`` (the body names another node); 409
            ``node_urls_changed`` or ``base_model_mismatch`` (URLs and base model are fixed at registration).
    """
    name = token_node_name(token)
    with transaction.atomic():  # a refusal raises out of it: nothing written, the row's lock released
        node, last_sample = _lock_node(name=name) if name else (None, None)
        if node is None or not token_matches(token, node.name, node.key_generation):
            raise NodeRefused(401, "invalid_node_token",
                              "Invalid node token; use the one quiver_node_register printed.")
        floor = settings.QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S
        if floor and node.last_heartbeat_at is not None and \
                timezone.now() - node.last_heartbeat_at < timedelta(seconds=floor):
            raise NodeRefused(429, "heartbeat_too_soon", f"Heartbeats of one node come at most every {floor} s "
                              "(QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S); this one is not recorded.")
        state = _checked(node, body() if callable(body) else body)
        if node.deregistered_at is not None:
            return node  # as node_heartbeat: a deregistered node's report is not recorded
        return _record(node, state, last_sample)


def _checked(node: Node, body: Any) -> dict[str, Any]:
    """``body`` validated for ``node`` (see ``node_heartbeat_accept``'s errors)."""
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
    return state


def nodes_live(base_model: BaseModel) -> QuerySet[Node]:
    """Healthy nodes serving ``base_model`` whose last heartbeat is within ``QUIVER_NODE_STALE_AFTER_S``."""
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(base_model=base_model, healthy=True, last_heartbeat_at__gte=fresh)


def node_heartbeat(*, node: Node, state: Mapping[str, Any]) -> Node:
    """Record an authenticated, validated state report of ``node`` and reconcile its placements.

    Heartbeats come through ``node_heartbeat_accept``, which checks the token, the identity, the URLs and every
    figure first, then records as this does; the node's name, URLs and base model are never taken from the report.

    Args:
        node: the registered node the heartbeat's token belongs to.
        state: the agent's ``GET /v1/state`` JSON (``healthy``, ``adapters`` [{``lora_name``, ``lora_int_id``,
            ``tier``, ``pinned``, ``served``}], capacities, KV and queue gauges).

    Returns:
        The node. Only versions that exist, serve this node's base model, carry their own served name and that the
        control plane asked this node to load (``Placement.load_issued_at``, set by a warm or a pin) are recorded;
        versions the node no longer reports drop to ``cold`` on it (a pin naming the node keeps its mark there).
        A row written since the node's previous heartbeat (a load or an evict meanwhile) takes nothing from this
        report, which may predate the write, but news that a load it asked for is resident
        (``inference.policy.node_report.report_changes``). A version claimed without having been asked for is
        ignored (its requests never go there) and logged once per node and version
        (``node.heartbeat_unasked_version``).

        Change-only: the node row is one UPDATE of the fields that moved (its last-seen time always), and placement
        rows are written only where their tier, pin or served mark moved (one UPDATE per distinct set of values).
        When the report and the node's rows give the digest its last settled accept stored
        (``Node.residency_digest``, ``inference.policy.node_report.report_digest``), nothing would change: the
        versions are not read and no placement row is written.
    """
    with transaction.atomic():
        locked, last_sample = _lock_node(pk=node.pk)
        if locked is None:
            raise Node.DoesNotExist(f"node {node.pk} is gone")
        if locked.key_generation != node.key_generation or locked.deregistered_at is not None:
            return locked  # rotated or deregistered between authenticating this heartbeat and now: write nothing
        return _record(locked, state, last_sample)


def _lock_node(**lookup: Any) -> tuple[Node | None, datetime | None]:
    """The node matching ``lookup`` locked for the transaction, with its base model, and its last sample's time
    (None: none yet), in one query. Only the node's own row is locked: every node shares its base model's row."""
    last = NodeSample.objects.filter(node=OuterRef("pk")).order_by("-t").values("t")[:1]
    row = (Node.objects.select_for_update(of=("self",)).select_related("base_model")
           .annotate(last_sample_at=Subquery(last)).filter(**lookup).first())
    return row, (getattr(row, "last_sample_at", None) if row is not None else None)


def _record(node: Node, state: Mapping[str, Any], last_sample: datetime | None) -> Node:
    """``node_heartbeat`` on the locked ``node``, whose last sample was taken at ``last_sample``."""
    previous = node.last_heartbeat_at
    now = timezone.now()
    reported = [_reported(entry) for entry in state.get("adapters", [])]
    rows, versions = _placement_rows(node)
    # Versions named without a row on the node: no row shows their deletion, so their existence is checked.
    unplaced = _versions([entry.lora_int_id for entry in reported if entry.lora_int_id not in versions])
    digest = node.residency_digest
    if not digest or report_digest(reported, rows, unplaced) != digest:
        digest = _record_report(node, reported, rows, {**versions, **unplaced}, unplaced, previous=previous, now=now)
    # The node's figures up to its ceilings: the report is the node's word, the ceilings the operator's.
    capacity = capacity_effective(state, node_ceilings(node))
    _log_clamps(node, capacity, previous=node.state or {})
    fields = {"healthy": bool(state.get("healthy")), "last_heartbeat_at": now,
              "max_loras": capacity.max_loras, "max_cpu_loras": capacity.max_cpu_loras,
              "max_lora_rank": capacity.max_lora_rank,
              "kv_cache_usage_perc": state.get("kv_cache_usage_perc"),
              "num_requests_running": state.get("num_requests_running"),
              "num_requests_waiting": state.get("num_requests_waiting"),
              "state": {k: v for k, v in state.items() if k not in ("agent_url", "engine_url")},
              "residency_digest": digest}
    changed = [name for name, value in fields.items() if getattr(node, name) != value]
    for name in changed:
        setattr(node, name, fields[name])
    node.save(update_fields=changed)
    node_sample_after(node=node, state=state, now=now, last=last_sample)
    return node


def _reported(entry: Mapping[str, Any]) -> ReportedAdapter:
    served = entry.get("served")
    return ReportedAdapter(entry["lora_name"], int(entry["lora_int_id"]), entry["tier"], bool(entry.get("pinned")),
                           served if isinstance(served, bool) else None)


# What a heartbeat needs of a version: its served name, its adapter's base model and its tenant's slug (for logs).
VersionFacts = tuple[str, int | None, str]


def _placement_rows(node: Node) -> tuple[list[PlacementRow], dict[int, VersionFacts]]:
    """Every placement row of ``node`` with its version's operator pins, and the facts of those versions, as values
    in one query (a row goes with its version, so these need no other lookup)."""
    rows: list[PlacementRow] = []
    versions: dict[int, VersionFacts] = {}
    for (pk, version_id, tier, pinned, served, warming_since, load_issued_at, updated_at, fleet, names, slug,
         adapter_name, base_model_id) in Placement.objects.filter(node=node).values_list(
            "pk", "adapter_version_id", "tier", "pinned", "served", "warming_since", "load_issued_at", "updated_at",
            "adapter_version__intent__pinned_fleet", "adapter_version__intent__pinned_nodes",
            "adapter_version__adapter__tenant__slug", "adapter_version__adapter__name",
            "adapter_version__adapter__base_model_id"):
        rows.append(PlacementRow(pk, version_id, tier, pinned, served, warming_since, load_issued_at, updated_at,
                                 pinned_fleet=bool(fleet), pinned_here=node.name in (names or ())))
        versions[version_id] = (served_name(slug, adapter_name, version_id), base_model_id, slug)
    return rows, versions


def _versions(ids: list[int]) -> dict[int, VersionFacts]:
    """The facts of the versions among ``ids`` that exist (one query, none without ids)."""
    if not ids:
        return {}
    return {pk: (served_name(slug, name, pk), base_model_id, slug)
            for pk, slug, name, base_model_id in AdapterVersion.objects.filter(pk__in=ids).values_list(
                "pk", "adapter__tenant__slug", "adapter__name", "adapter__base_model_id")}


def _record_report(node: Node, reported: list[ReportedAdapter], rows: list[PlacementRow],
                   versions: dict[int, VersionFacts], unplaced: Mapping[int, VersionFacts], *,
                   previous: datetime | None, now: datetime) -> str:
    """Write what ``reported`` changes on ``node``'s placement rows (``report_changes``), stamping written rows
    ``now``. ``versions``: the facts of every version the rows or the report name that exists; ``unplaced``: those
    of reported versions without a row. Returns the digest to store: the report's and the rows' as written when
    they settled, else ``""`` (the next accept decides again)."""
    by_id = {entry.lora_int_id: entry for entry in reported}
    # Known versions only: the id exists, is for this node's base model, and the name is that version's own.
    owned = {pk for pk, entry in by_id.items() if pk in versions and versions[pk][0] == entry.lora_name}
    ours = {pk for pk in owned if versions[pk][1] == node.base_model_id}
    changes = report_changes(reported=reported, owned=owned, ours=ours, rows=rows, previous=previous)
    # A copy no version owns (deleted while the node was away, or never ours) is garbage on that node (bounded per
    # report: the names come from the node).
    purge_node_orphans(node.pk, changes.orphans)
    for version_id in changes.unasked:
        _log_unasked_claim(node, version_id, versions[version_id][2], by_id[version_id])
    # One UPDATE per distinct set of values written: a few per report (rows move between a handful of tiers), each
    # far cheaper to build than Django's bulk_update (a CASE per field and row: 21 % of the listener's CPU in py-spy).
    groups: dict[tuple[tuple[str, Any], ...], list[int]] = {}
    for pk, wanted in changes.updates.items():
        groups.setdefault(tuple(sorted(wanted.items())), []).append(pk)
    for values, pks in groups.items():
        Placement.objects.filter(pk__in=pks).update(**dict(values), updated_at=now)
    # Re-checked as the UPDATE runs: a warm that started since the rows were read keeps its row.
    gone = Placement.objects.filter(tier__in=[*RESIDENT, Placement.Tier.STAGED], warming_since=None)
    if changes.to_cold:
        gone.filter(pk__in=changes.to_cold).update(tier=Placement.Tier.COLD, pinned=False, served=False)
    if changes.to_cold_keep_pin:
        gone.filter(pk__in=changes.to_cold_keep_pin).update(tier=Placement.Tier.COLD, served=False)
    if changes.to_cold or changes.to_cold_keep_pin or any(not (w.get("served", True) or w.get("tier") in RESIDENT)
                                                          for w in changes.updates.values()):
        # The node dropped copies (its own eviction): every gateway re-reads now instead of routing requests there
        # until its next refresh, each then a 404 and a reroute.
        invalidation_publish_on_commit("placements")
    return report_digest(reported, changes.rows_after, unplaced) if changes.settled else ""


def _log_unasked_claim(node: Node, version_id: int, tenant_slug: str, entry: ReportedAdapter) -> None:
    """Log, once per (node, version) in this process, a heartbeat claiming a version the node was never asked to
    load (a forged report, or copies left from before the node was deregistered); heartbeats repeat every second."""
    key = (node.pk, version_id)
    with _UNASKED_LOCK:
        if key in _UNASKED_LOGGED:
            return
        _UNASKED_LOGGED[key] = None
        while len(_UNASKED_LOGGED) > _UNASKED_LOGGED_MAX:
            _UNASKED_LOGGED.popitem(last=False)
    logger.warning("node.heartbeat_unasked_version", extra={
        "node": node.name, "version_id": version_id, "tenant": tenant_slug,
        "tier": entry.tier, "served": entry.served, "action": "ignored"})


def node_mark_stale() -> int:
    """Mark nodes without a recent heartbeat unhealthy; returns how many changed."""
    cutoff = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(healthy=True, last_heartbeat_at__lt=cutoff).update(healthy=False)
