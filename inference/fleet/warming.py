"""Warm and evict: loading adapter versions onto nodes and unloading them (conventions §1 names).

Tiers follow LoRAX's ``AdapterStatus`` and vLLM's caches: ``hot`` (in a running batch), ``warm`` (in the engine's
CPU/GPU LoRA cache), ``staged`` (on node disk), ``cold`` (only in S3), ``errored`` (failed load).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg.errors import DeadlockDetected

from adapters_app.models import AdapterVersion
from adapters_app.selectors import adapter_version_no_effect_refused, adapter_version_untrained
from adapters_app.services import adapter_version_effect_record
from adapters_app.storage import presign_get
from common.bus import invalidation_publish_on_commit
from inference.fleet.load_answers import load_answer_checked
from inference.fleet.models import RESIDENT, Node, Placement
from inference.fleet.node_client import NodeCallFailed, node_call
from inference.fleet.nodes import nodes_live
from inference.fleet.plan import plan_homes
from inference.policy.placement import WarmCandidate, warm_target
from workers import schedule
from workers.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)
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


def warm_target_node(version: AdapterVersion, *, node_id: int | None = None,
                     exclude: Collection[int] = ()) -> Node | None:
    """The live node that should load ``version`` now: the one pure choice
    (:func:`inference.policy.placement.warm_target`) over the live nodes of its base model, the plan's homes and the
    nodes where its load failed. ``node_id`` names a node to keep while it is live; nodes whose pk is in ``exclude``
    are not candidates. None when no node fits."""
    live = [n for n in nodes_live(version.adapter.base_model) if n.pk not in exclude]
    failed = set(Placement.objects.filter(adapter_version=version, tier=Placement.Tier.ERRORED)
                 .values_list("node_id", flat=True))
    named = next((n.name for n in live if n.pk == node_id), None) if node_id is not None else None
    chosen = warm_target(version.pk, r=version.r or 0, homes=plan_homes(version.pk), named=named,
                         candidates=[WarmCandidate(n.name, n.max_lora_rank, failed=n.pk in failed) for n in live])
    return next((n for n in live if n.name == chosen), None)


def warm_for_request(version_id: int, node_id: int | None = None) -> int | None:
    """The gateway's one way to ask the fleet for a warm: a request needs version ``version_id`` loaded.

    Picks the node (:func:`warm_target_node`; ``node_id`` is the router's pick or the node an earlier ask chose) and
    asks a worker to load it there (:func:`placement_request_warm`). Returns the node's pk; None when the version is
    gone or no live node serves its base model at its rank.
    """
    version = AdapterVersion.objects.select_related("adapter__base_model", "adapter__tenant").filter(
        pk=version_id).first()
    if version is None:
        return None
    node = warm_target_node(version, node_id=node_id)
    if node is None:
        return None
    placement_request_warm(version, node=node)
    return node.pk


def placement_warm(version: AdapterVersion, *, node: Node, pin: bool = False) -> Placement:
    """Load ``version`` onto ``node`` through its agent (S3 → node disk, sha256 checked → engine ``add_lora``).

    Each file goes with a presigned GET valid ``QUIVER_NODE_FETCH_URL_TTL_S``: nodes hold no S3 credential, so a node
    reads only what it is asked to load (docs/security.md).

    ``lora_int_id`` is the version's primary key (conventions §11), ``lora_name`` its served name. The agent probes
    the adapter's effect after the load (``inference.node.effect_probe.EffectProbe.probe``); a version that changes
    nothing is refused (``no_effect``) unless validation already warned it is untrained (then it is served, and the
    report says so). One node's refusal is that node's alone (:func:`_no_effect_verdict`): the version is refused
    fleet-wide, and its tenant's report says so, only once a second node agrees (or the node is the only one that
    can load it). The answer's figures are checked before they are stored
    (``inference.fleet.load_answers.load_answer_checked``).

    Raises:
        NodeCallFailed: the agent refused or failed; the placement is left ``errored`` with the reason.
    """
    placement = placement_mark_load_issued(node.pk, version.pk)
    untrained = adapter_version_untrained(version)
    payload = {
        "lora_name": version.served_name,
        "lora_int_id": version.lora_int_id,
        "files": [{**{k: f[k] for k in ("name", "s3_key", "sha256", "size")},
                   "url": presign_get(f["s3_key"], expires_s=settings.QUIVER_NODE_FETCH_URL_TTL_S)}
                  for f in version.files],
        "pin": pin,
        "expect_effect": not untrained,
    }
    try:
        raw = node_call(node, "/v1/adapters/load", payload)
    except NodeCallFailed as exc:
        # One transaction: the refusing row and a second opinion's warm become visible together, and the version's
        # row lock makes concurrent refusals of one version count each other (see _no_effect_verdict).
        with transaction.atomic():
            if exc.code == "no_effect":
                list(AdapterVersion.objects.select_for_update().filter(pk=version.pk).values_list("pk", flat=True))
            placement.tier = Placement.Tier.ERRORED
            placement.last_error = f"{exc.code}: {exc.detail}"[:2000]
            placement.warming_since = None
            placement.save(update_fields=["tier", "last_error", "warming_since", "updated_at"])
            logger.warning("placement.warm_failed", extra={"version_id": version.pk, "node": node.name,
                                                           "code": exc.code})
            if exc.code == "no_effect":
                _no_effect_verdict(version, node=node)
        raise
    answer = load_answer_checked(raw, node=node.name, version_id=version.pk)
    if answer.effect == "no_effect" and not untrained:
        # An agent refuses such a load (422 above); one that serves it and says so is not telling the truth about
        # one of the two: its word does not go into the tenant's report.
        logger.warning("placement.effect_answer_inconsistent", extra={"version_id": version.pk, "node": node.name})
    else:
        adapter_version_effect_record(version, verdict=answer.effect, served=True)
    if answer.effect == "changed":
        _no_effect_disputes(version, node=node)
    placement.tier = answer.tier
    placement.served = True
    # The pin is the operator's (``pin``, from the intent); the node's answer can only say the engine did not take it.
    placement.pinned = pin and (pin if answer.pinned is None else answer.pinned)
    placement.load_ms = answer.load_ms
    placement.last_error = ""
    placement.warming_since = None
    placement.save(update_fields=["tier", "served", "pinned", "load_ms", "last_error", "warming_since", "updated_at"])
    logger.info("placement.warmed", extra={"version_id": version.pk, "node": node.name, "load_ms": placement.load_ms})
    return placement


def _no_effect_nodes(version: AdapterVersion) -> set[int]:
    """The nodes (pks) whose load of ``version`` ended in a ``no_effect`` refusal still on record."""
    return set(Placement.objects.filter(adapter_version=version, tier=Placement.Tier.ERRORED,
                                        last_error__startswith="no_effect").values_list("node_id", flat=True))


def _no_effect_verdict(version: AdapterVersion, *, node: Node) -> None:
    """Node ``node`` refused ``version`` as ``no_effect`` (its row already ``errored``): decide what that changes
    beyond that node. Runs inside :func:`placement_warm`'s transaction, with the version's row locked.

    A node's probe is its own word, and a host holding a stolen node credential could say it for any version it is
    sent: recorded on the version (``adapter_version_effect_record``), one such answer refused the version on every
    node, 503'd its requests and told its tenant the upload was broken (issue 30). So:

    - a node already loaded it with effect (the version's ``effect_probe`` says ``changed``): the refusal stays
      this node's, and it is logged as suspect (``placement.no_effect_disputed``);
    - else, once ``min(2, n)`` distinct nodes refused it, ``n`` the registered nodes of its base model able to load
      its rank, the verdict is confirmed and recorded: the version is refused everywhere
      (``adapter_version_no_effect_refused``) and its report shows the error;
    - else a second opinion is asked: a warm on another live node that has not refused it (the warm target's
      choice among them), so that a truly inert adapter is refused after two loads, not one per node.

    A node's own refusal keeps that node from being sent the version again (``_request_warm_once``).
    """
    probe = (AdapterVersion.objects.filter(pk=version.pk).values_list("validation_report", flat=True).first()
             or {}).get("effect_probe") or {}
    refused = _no_effect_nodes(version)
    extra = {"version_id": version.pk, "node": node.name, "refusals": len(refused)}
    if probe.get("verdict") == "changed":
        logger.warning("placement.no_effect_disputed", extra=extra)
        return
    able = Node.objects.filter(base_model_id=version.adapter.base_model_id, deregistered_at=None,
                               max_lora_rank__gte=version.r or 0).count()
    if len(refused) >= max(1, min(2, able)):
        adapter_version_effect_record(version, verdict="no_effect", served=False)
        logger.warning("placement.no_effect_confirmed", extra=extra)
        return
    other = warm_target_node(version, exclude=refused)
    if other is not None:
        placement_request_warm(version, node=other)
    logger.warning("placement.no_effect_unconfirmed", extra={**extra, "second_opinion": other.name if other else ""})


def _no_effect_disputes(version: AdapterVersion, *, node: Node) -> None:
    """Node ``node`` loaded ``version`` with effect: any node that refused it as ``no_effect`` said the opposite of
    what an engine of the same base model finds, and is logged (``placement.no_effect_disputed``)."""
    refused = _no_effect_nodes(version) - {node.pk}
    if refused:
        names = sorted(Node.objects.filter(pk__in=refused).values_list("name", flat=True))
        logger.warning("placement.no_effect_disputed", extra={"version_id": version.pk, "node": node.name,
                                                              "refused_by": names})


def placement_evict(placement: Placement) -> Placement:
    """Unload a version from its node's engine (the disk copy stays: tier ``staged``).

    Raises:
        NodeCallFailed: the agent refused or failed.
    """
    node_call(placement.node, "/v1/adapters/unload", {"lora_name": placement.adapter_version.served_name})
    placement.tier = Placement.Tier.STAGED
    placement.pinned = False
    placement.served = False
    placement.updated_at = timezone.now()
    # An update, not save(update_fields=...): a row deleted meanwhile (its version or node gone) is no error; the
    # engine has unloaded the copy either way (a whole-suite run: DatabaseError "did not affect any rows").
    Placement.objects.filter(pk=placement.pk).update(tier=placement.tier, pinned=False, served=False,
                                                     updated_at=placement.updated_at)
    invalidation_publish_on_commit("placements")  # every gateway stops routing here now, not at its next refresh
    return placement


def placement_request_warm(version: AdapterVersion, *, node: Node, even_if_served: bool = False,
                           repin: bool = False) -> Placement:
    """Ask a worker to warm ``version`` on ``node`` unless it is resident or a warm is already in flight
    (:func:`placement_request_warm_enqueued`, which also says whether a warm was enqueued).

    A row whose name the engine still serves from disk (tier ``staged``, ``served``: its CPU cache dropped the
    weights) is skipped too, since a request there reloads it itself, unless ``even_if_served``: the reconciler's
    pre-warm, which wants the version back in the engine (``hot``/``warm``) before its requests come.

    The enqueue happens on commit; a warm older than ``QUIVER_WARM_WAIT_S`` counts as lost and is re-sent. A version
    a node's effect probe refused (``no_effect``) is not loaded again on that node, nor anywhere once the refusal is
    confirmed (:func:`_no_effect_verdict`): the placement is left ``errored`` with that code, which the gateway
    answers at once instead of reloading it for every request.

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
        refused_here = placement.tier == Placement.Tier.ERRORED and placement.last_error.startswith("no_effect")
        if adapter_version_no_effect_refused(version):
            if not refused_here:
                placement.tier, placement.warming_since = Placement.Tier.ERRORED, None
                placement.last_error = "no_effect: the adapter changes nothing (effect probe)"
                placement.save(update_fields=["tier", "warming_since", "last_error", "updated_at"])
            return placement, False
        if refused_here:
            return placement, False  # this node's own probe refused it: its answer would be the same
        stale = timezone.now() - timedelta(seconds=settings.QUIVER_WARM_WAIT_S)
        in_flight = placement.warming_since is not None and placement.warming_since > stale
        if in_flight or (not repin and (placement.tier in RESIDENT or (placement.served and not even_if_served))):
            return placement, False
        placement.warming_since = timezone.now()
        placement.load_issued_at = placement.load_issued_at or placement.warming_since
        placement.save(update_fields=["warming_since", "load_issued_at", "updated_at"])
        enqueue_on_commit(schedule.PLACEMENT_WARM, placement.pk)
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
    """Warm a newly ready version on its node (:func:`warm_target_node`). Older versions stay: a new version takes
    no traffic until it is promoted (``adapters_app.serving``), ``name@N`` reaches any ready version, and a version
    that leaves the serving rule drains (its in-flight requests finish; the engines' LRUs and the reconciler
    reclaim its slots once nothing asks for it). Returns the new placement, None when no node fits."""
    node = warm_target_node(version)
    return placement_request_warm(version, node=node) if node else None


def version_warm_state(version_id: int) -> str:
    """Warm before traffic (``adapters_app.signals.FleetPort.version_warm``): ``"warm"`` when a live node's engine
    holds version ``version_id`` now, else ask for a warm on its node (:func:`warm_target_node`,
    :func:`placement_request_warm`: a no-op while one is in flight) and answer ``"warming"``; ``"no_node"`` when the
    version is gone or no live node can load it."""
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    if Placement.objects.filter(adapter_version_id=version_id, tier__in=RESIDENT, node__healthy=True,
                                node__last_heartbeat_at__gte=fresh).exists():
        return "warm"
    version = AdapterVersion.objects.select_related("adapter__base_model", "adapter__tenant").filter(
        pk=version_id).first()
    node = warm_target_node(version) if version is not None else None
    if version is None or node is None:
        return "no_node"
    # Even where the engine still answers the name from disk: a request there would pay the load.
    placement_request_warm(version, node=node, even_if_served=True)
    return "warming"
