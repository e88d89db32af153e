"""Placement services: node heartbeats, warming versions onto nodes, evicting them (conventions §1 names).

Tiers follow LoRAX's ``AdapterStatus`` and vLLM's caches: ``hot`` (in a running batch), ``warm`` (in the engine's
CPU/GPU LoRA cache), ``staged`` (on node disk), ``cold`` (only in S3), ``errored`` (failed load).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone
from psycopg.errors import DeadlockDetected

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.purge import purge_node_orphans
from adapters_app.selectors import adapter_version_no_effect_refused, adapter_version_untrained
from adapters_app.services import adapter_version_effect_record
from inference.gateway.models import Node, Placement
from inference.gateway.node_client import NodeCallFailed, node_call
from inference.gateway.node_samples import node_sample_record
from inference.gateway.tasks import placement_evict_task, placement_warm_task
from workers.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)
RESIDENT = (Placement.Tier.WARM, Placement.Tier.HOT)
# (node id, version id) pairs already logged as claimed unasked; bounded, oldest forgotten first.
_UNASKED_LOGGED: OrderedDict[tuple[int, int], None] = OrderedDict()
_UNASKED_LOGGED_MAX = 10_000
_UNASKED_LOCK = threading.Lock()


def nodes_live(base_model: BaseModel) -> QuerySet[Node]:
    """Healthy nodes serving ``base_model`` whose last heartbeat is within ``QUIVER_NODE_STALE_AFTER_S``."""
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(base_model=base_model, healthy=True, last_heartbeat_at__gte=fresh)


def node_heartbeat(*, node: Node, state: Mapping[str, Any]) -> Node:
    """Record an authenticated, validated state report of ``node`` and reconcile its placements.

    Callers go through ``inference.gateway.nodes.node_heartbeat_accept``, which checks the token, the identity, the
    URLs and every figure first; the node's name, URLs and base model are never taken from the report.

    Args:
        node: the registered node the heartbeat's token belongs to.
        state: the agent's ``GET /v1/state`` JSON (``healthy``, ``adapters`` [{``lora_name``, ``lora_int_id``,
            ``tier``, ``pinned``, ``served``}], capacities, KV and queue gauges).

    Returns:
        The node. Only versions that exist, serve this node's base model, carry their own served name and that the
        control plane asked this node to load (``Placement.load_issued_at``, set by a warm or a pin) are recorded;
        versions the node no longer reports drop to ``cold`` on it. A version claimed without having been asked
        for is ignored (its requests never go there) and logged once per node and version
        (``node.heartbeat_unasked_version``).
    """
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        if locked.key_generation != node.key_generation or locked.deregistered_at is not None:
            return locked  # rotated or deregistered between authenticating this heartbeat and now: write nothing
        node = locked
        node.healthy = bool(state.get("healthy"))
        node.last_heartbeat_at = timezone.now()
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
        known = set(current)
        for version in versions:
            if version.pk in ours and version.pk not in known:
                _log_unasked_claim(node, version, reported[version.pk])
        for version_id in known:
            entry = reported[version_id]
            tier = entry["tier"]
            wanted = {"tier": tier, "pinned": bool(entry.get("pinned")),
                      "served": bool(entry.get("served", tier in RESIDENT)), "warming_since": None}
            row = current[version_id]
            if row.warming_since is not None and tier not in RESIDENT:
                # A warm in flight keeps its mark until the node reports the version resident or the warm task
                # records its outcome: cleared here, the row's previous failure would answer the waiting request.
                del wanted["warming_since"]
            # Heartbeats come every few seconds: write only what changed.
            if any(getattr(row, k) != v for k, v in wanted.items()):
                Placement.objects.filter(pk=row.pk).update(**wanted, updated_at=timezone.now())
        # Only rows the node once held drop to cold; in-flight warms keep their state.
        Placement.objects.filter(node=node, tier__in=[*RESIDENT, Placement.Tier.STAGED], warming_since=None).exclude(
            adapter_version_id__in=known
        ).update(tier=Placement.Tier.COLD, pinned=False, served=False)
    return node


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


def placement_mark_load_issued(node_id: int, version_id: int) -> Placement:
    """Record that the control plane asks node ``node_id`` to load version ``version_id`` (a warm queued or sent, a
    pin): from now on that node's heartbeats may report the version, and the gateway may route it there.

    Creates the placement row (tier ``cold``) if there is none; an earlier mark is kept. Committed at once outside a
    transaction, which :func:`placement_warm` relies on: the node's heartbeat may report the version before the
    load call returns.

    Returns:
        The placement row.

    Raises:
        django.db.IntegrityError: no such node or version.
    """
    placement, _ = Placement.objects.get_or_create(node_id=node_id, adapter_version_id=version_id)
    if placement.load_issued_at is None:
        placement.load_issued_at = timezone.now()
        Placement.objects.filter(pk=placement.pk, load_issued_at=None).update(load_issued_at=placement.load_issued_at)
    return placement


def node_select_for_warm(base_model: BaseModel, *, r: int | None = None) -> Node | None:
    """The live node of ``base_model`` able to load rank ``r`` (its engine's ``--max-lora-rank``) with the fewest
    resident adapters, then the lowest KV usage; None if none."""
    return (
        nodes_live(base_model)
        .filter(max_lora_rank__gte=r or 0)
        .annotate(resident=Count("placements", filter=Q(placements__tier__in=RESIDENT)))
        .order_by("resident", "kv_cache_usage_perc", "name")
        .first()
    )


def placement_warm(version: AdapterVersion, *, node: Node, pin: bool = False) -> Placement:
    """Load ``version`` onto ``node`` through its agent (S3 → node disk, sha256 checked → engine ``add_lora``).

    ``lora_int_id`` is the version's primary key (conventions §11), ``lora_name`` its served name. The agent probes
    the adapter's effect after the load (``inference.node.service.NodeAgent.probe_effect``); the verdict is recorded
    on the version (``adapter_version_effect_record``). A version that changes nothing is refused (``no_effect``)
    unless validation already warned it is untrained (then it is served, and the report says so).

    Raises:
        NodeCallFailed: the agent refused or failed; the placement is left ``errored`` with the reason.
    """
    placement = placement_mark_load_issued(node.pk, version.pk)
    untrained = adapter_version_untrained(version)
    payload = {
        "lora_name": version.served_name,
        "lora_int_id": version.lora_int_id,
        "files": [{k: f[k] for k in ("name", "s3_key", "sha256", "size")} for f in version.files],
        "pin": pin,
        "expect_effect": not untrained,
    }
    try:
        answer = node_call(node, "/v1/adapters/load", payload)
    except NodeCallFailed as exc:
        placement.tier = Placement.Tier.ERRORED
        placement.last_error = f"{exc.code}: {exc.detail}"[:2000]
        placement.warming_since = None
        placement.save(update_fields=["tier", "last_error", "warming_since", "updated_at"])
        logger.warning("placement.warm_failed", extra={"version_id": version.pk, "node": node.name, "code": exc.code})
        if exc.code == "no_effect":
            adapter_version_effect_record(version, verdict="no_effect", served=False)
        raise
    adapter_version_effect_record(version, verdict=str(answer.get("effect", "")), served=True)
    placement.tier = answer.get("tier", Placement.Tier.WARM)
    placement.served = True
    placement.pinned = bool(answer.get("pinned", pin))
    placement.load_ms = answer.get("load_ms")
    placement.last_error = ""
    placement.warming_since = None
    placement.save(update_fields=["tier", "served", "pinned", "load_ms", "last_error", "warming_since", "updated_at"])
    logger.info("placement.warmed", extra={"version_id": version.pk, "node": node.name, "load_ms": placement.load_ms})
    return placement


def placement_evict(placement: Placement) -> Placement:
    """Unload a version from its node's engine (the disk copy stays: tier ``staged``).

    Raises:
        NodeCallFailed: the agent refused or failed.
    """
    node_call(placement.node, "/v1/adapters/unload", {"lora_name": placement.adapter_version.served_name})
    placement.tier = Placement.Tier.STAGED
    placement.pinned = False
    placement.served = False
    placement.save(update_fields=["tier", "pinned", "served", "updated_at"])
    return placement


def placement_request_warm(version: AdapterVersion, *, node: Node, even_if_served: bool = False,
                           repin: bool = False) -> Placement:
    """Ask a worker to warm ``version`` on ``node`` unless it is resident or a warm is already in flight
    (:func:`placement_request_warm_enqueued`, which also says whether a warm was enqueued).

    A row whose name the engine still serves from disk (tier ``staged``, ``served``: its CPU cache dropped the
    weights) is skipped too, since a request there reloads it itself, unless ``even_if_served``: the reconciler's
    pre-warm, which wants the version back in the engine (``hot``/``warm``) before its requests come.

    The enqueue happens on commit; a warm older than ``QUIVER_WARM_WAIT_S`` counts as lost and is re-sent. A version
    a node's effect probe refused (``no_effect``) is not loaded again: the placement is left ``errored`` with that
    code, which the gateway answers at once instead of reloading it for every request.

    A deadlock with a concurrent heartbeat's placement writes is retried (PostgreSQL aborts one side; its docs
    say to retry the transaction); a third deadlock raises ``OperationalError``.
    """
    return placement_request_warm_enqueued(version, node=node, even_if_served=even_if_served, repin=repin)[0]


def placement_request_warm_enqueued(version: AdapterVersion, *, node: Node, even_if_served: bool = False,
                                    repin: bool = False) -> tuple[Placement, bool]:
    """:func:`placement_request_warm`, also saying whether it enqueued a warm (False: resident, served, in flight,
    or refused as ``no_effect``), so the reconciler counts only the warms it actually asked for."""
    for attempt in range(3):
        try:
            return _request_warm_once(version, node=node, even_if_served=even_if_served, repin=repin)
        except OperationalError as exc:
            if attempt == 2 or not isinstance(exc.__cause__, DeadlockDetected):
                raise
    raise AssertionError("unreachable")


def _request_warm_once(version: AdapterVersion, *, node: Node, even_if_served: bool,
                       repin: bool = False) -> tuple[Placement, bool]:
    with transaction.atomic():
        placement, _ = Placement.objects.select_for_update().get_or_create(node=node, adapter_version=version)
        if adapter_version_no_effect_refused(version):
            if placement.tier != Placement.Tier.ERRORED or not placement.last_error.startswith("no_effect"):
                placement.tier, placement.warming_since = Placement.Tier.ERRORED, None
                placement.last_error = "no_effect: the adapter changes nothing (effect probe)"
                placement.save(update_fields=["tier", "warming_since", "last_error", "updated_at"])
            return placement, False
        stale = timezone.now() - timedelta(seconds=settings.QUIVER_WARM_WAIT_S)
        in_flight = placement.warming_since is not None and placement.warming_since > stale
        if in_flight or (not repin and (placement.tier in RESIDENT or (placement.served and not even_if_served))):
            return placement, False
        placement.warming_since = timezone.now()
        placement.load_issued_at = placement.load_issued_at or placement.warming_since
        placement.save(update_fields=["warming_since", "load_issued_at", "updated_at"])
        enqueue_on_commit(placement_warm_task, placement.pk)
    return placement, True


def placement_mark_not_served(node_id: int, version_id: int) -> int:
    """The node's engine answered 404 for the version's served name: the row stops saying it serves there.

    Observed state, as a heartbeat would write it a second later (``node_heartbeat``); written now so that the
    gateway's next fleet read routes elsewhere or warms it (``placement_request_warm`` skips rows still marked
    served). A resident row drops to ``staged`` (the node's disk copy stays on an unload); a warm in flight is left
    alone. Returns the rows changed (0 or 1).
    """
    return Placement.objects.filter(node_id=node_id, adapter_version_id=version_id, warming_since=None).filter(
        Q(tier__in=RESIDENT) | Q(served=True)).update(
        tier=Placement.Tier.STAGED, served=False, pinned=False, updated_at=timezone.now())


def placement_on_ready(version: AdapterVersion) -> Placement | None:
    """Warm a newly ready version on the least-loaded live node of its base model, and evict the adapter's older
    versions (the gateway only routes to the newest ready one). Returns the new placement, None when no node fits."""
    older = Placement.objects.filter(
        Q(tier__in=RESIDENT) | Q(served=True), adapter_version__adapter=version.adapter,
        adapter_version__number__lt=version.number,
    ).values_list("pk", flat=True)
    for placement_id in list(older):
        enqueue_on_commit(placement_evict_task, placement_id)
    node = node_select_for_warm(version.adapter.base_model, r=version.r)
    return placement_request_warm(version, node=node) if node else None


def node_mark_stale() -> int:
    """Mark nodes without a recent heartbeat unhealthy; returns how many changed."""
    cutoff = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    return Node.objects.filter(healthy=True, last_heartbeat_at__lt=cutoff).update(healthy=False)
