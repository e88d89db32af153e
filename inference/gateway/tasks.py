"""Celery tasks of the fleet and the gateway: thin and idempotent; they take ids, fetch rows, call services
(conventions §8).

Imports sit inside the tasks: the services that enqueue these tasks are imported by them, so a module-level import
would be circular within the app.
"""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(max_retries=0)
def placement_warm_task(placement_id: int) -> None:
    """Warm one placement row's version on its node; failures are recorded on the row (tier ``errored``).

    The pin comes from the operator's intent (``VersionIntent``), not only from the row: heartbeats rewrite the row's
    ``pinned`` with what the engine reports, and one may land between a pin and this task.
    """
    from inference.gateway.models import Placement, VersionIntent
    from inference.gateway.node_client import NodeCallFailed
    from inference.gateway.placement import placement_warm

    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(pk=placement_id).first()
    if placement is None:
        return
    intent = VersionIntent.objects.filter(adapter_version_id=placement.adapter_version_id).first()
    pin = placement.pinned or bool(intent and (intent.pinned_fleet or placement.node.name in intent.pinned_nodes))
    try:
        placement_warm(placement.adapter_version, node=placement.node, pin=pin)
    except NodeCallFailed:
        logger.warning("placement_warm_task.failed", extra={"placement_id": placement_id})


@shared_task(max_retries=0)
def placement_evict_task(placement_id: int) -> None:
    """Unload one placement's version from its node."""
    from inference.gateway.models import Placement
    from inference.gateway.placement import placement_evict

    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(pk=placement_id).first()
    if placement is not None:
        placement_evict(placement)


@shared_task(ignore_result=True)
def fleet_reconcile_task() -> None:
    """Periodic (beat): converge placements toward the plan and operators' intent (``fleet_reconcile``)."""
    from inference.gateway.fleet_reconcile import fleet_reconcile

    fleet_reconcile()


@shared_task(ignore_result=True)
def node_mark_stale_task() -> None:
    """Periodic (beat): nodes without a fresh heartbeat become unhealthy."""
    from inference.gateway.placement import node_mark_stale

    node_mark_stale()


@shared_task(ignore_result=True, max_retries=0)
def usage_drain_task() -> None:
    """Beat, every second: move metered usage from the Redis stream into PostgreSQL (``metering.usage_drain``)."""
    from inference.gateway.metering import usage_drain

    usage_drain()


@shared_task(ignore_result=True, max_retries=0, time_limit=300, soft_time_limit=240)
def usage_rollup_task() -> None:
    """Beat, every minute: recompute the per-minute usage rollups of the lookback window (``rollups.usage_rollup``);
    the stream is drained first so what was metered a moment ago counts."""
    import redis

    from inference.gateway.metering import usage_drain
    from inference.gateway.rollups import usage_rollup

    try:
        usage_drain()
    except redis.RedisError as exc:  # roll up what is stored; the next tick sees the rest
        logger.warning("usage.drain_failed", extra={"error": str(exc)})
    usage_rollup()


@shared_task(ignore_result=True, max_retries=0, time_limit=1800, soft_time_limit=1700)
def usage_retention_task() -> None:
    """Beat, hourly: delete raw usage records past ``QUIVER_USAGE_RETENTION_DAYS`` (``rollups.usage_retention_purge``)."""
    from inference.gateway.rollups import usage_retention_purge

    usage_retention_purge()
