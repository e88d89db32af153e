"""Celery tasks of the fleet: thin and idempotent; they take ids, fetch rows, call services (conventions §8).

Services enqueue them by name (``workers.enqueue``; names in ``workers.schedule``, kept from when these tasks lived in
``inference.gateway.tasks``), so this module imports the services and nothing imports it back.
"""

from __future__ import annotations

import logging

from celery import shared_task

from inference.fleet.models import Placement, VersionIntent
from inference.fleet.node_client import NodeCallFailed
from inference.fleet.nodes import node_mark_stale
from inference.fleet.reconcile import fleet_reconcile
from inference.fleet.services import placement_evict_audited
from inference.fleet.warming import placement_evict, placement_warm
from workers import schedule

logger = logging.getLogger(__name__)


@shared_task(name=schedule.PLACEMENT_WARM, max_retries=0)
def placement_warm_task(placement_id: int) -> None:
    """Warm one placement row's version on its node; failures are recorded on the row (tier ``errored``).

    The pin comes from the operator's intent (``VersionIntent``), not only from the row: a heartbeat may clear the
    row's ``pinned`` where no intent covered it when it was read, and one may land between a pin and this task. A
    node's own word never makes a pin (``inference.policy.node_report.report_changes``).
    """
    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(pk=placement_id).first()
    if placement is None:
        return
    intent = VersionIntent.objects.filter(adapter_version_id=placement.adapter_version_id).first()
    pin = placement.pinned or bool(intent and (intent.pinned_fleet or placement.node.name in intent.pinned_nodes))
    try:
        placement_warm(placement.adapter_version, node=placement.node, pin=pin)
    except NodeCallFailed:
        logger.warning("placement_warm_task.failed", extra={"placement_id": placement_id})


@shared_task(name=schedule.PLACEMENT_EVICT, max_retries=0)
def placement_evict_task(placement_id: int, audit_id: int | None = None) -> None:
    """Unload one placement's version from its node; an operator's evict (``audit_id``: its audit row) records the
    outcome in that row (``placement_evict_audited``)."""
    if audit_id is not None:
        placement_evict_audited(placement_id, audit_id=audit_id)
        return
    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(pk=placement_id).first()
    if placement is not None:
        placement_evict(placement)


@shared_task(name=schedule.FLEET_RECONCILE, ignore_result=True)
def fleet_reconcile_task() -> None:
    """Periodic (beat): converge placements toward the plan and operators' intent (``fleet_reconcile``)."""
    fleet_reconcile()


@shared_task(name=schedule.NODE_MARK_STALE, ignore_result=True)
def node_mark_stale_task() -> None:
    """Periodic (beat): nodes without a fresh heartbeat become unhealthy."""
    node_mark_stale()
