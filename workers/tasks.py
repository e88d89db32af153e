"""Celery tasks: thin and idempotent; they take ids, fetch rows, call services (conventions §8)."""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


VALIDATE_RETRIES = 5


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=VALIDATE_RETRIES)
def adapter_version_validate_task(self, version_id: int) -> None:  # type: ignore[no-untyped-def]
    """Validate a version; on ``ready`` ask for a warm on a node. ``acks_late`` is safe: the status row guards reruns.

    Storage or disk trouble is retried with exponential backoff (5, 10, 20, 40, 80 s); once retries are spent the
    version ends ``rejected`` with ``validation_unavailable`` rather than staying ``validating``.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_version_fail, adapter_version_validate
    from inference.gateway.placement import placement_on_ready

    version = AdapterVersion.objects.select_related("adapter__base_model", "adapter__tenant").filter(pk=version_id).first()
    if version is None:
        return
    try:
        version = adapter_version_validate(version)
    except (BotoCoreError, ClientError, OSError) as exc:
        if self.request.retries >= VALIDATE_RETRIES:
            adapter_version_fail(version, code="validation_unavailable",
                                 message="The stored files could not be read for validation.",
                                 hint="Upload the same files again to retry.")
            return
        raise self.retry(exc=exc, countdown=5 * 2**self.request.retries) from exc
    if version.status == AdapterVersion.Status.READY:
        placement_on_ready(version)


@shared_task(max_retries=0)
def placement_warm_task(placement_id: int) -> None:
    """Warm one placement row's version on its node; failures are recorded on the row (tier ``errored``)."""
    from inference.gateway.models import Placement
    from inference.gateway.node_client import NodeCallFailed
    from inference.gateway.placement import placement_warm

    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(pk=placement_id).first()
    if placement is None:
        return
    try:
        placement_warm(placement.adapter_version, node=placement.node, pin=placement.pinned)
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


@shared_task(max_retries=3, default_retry_delay=10, retry_backoff=True, bind=True)
def node_unload_task(self, node_id: int, lora_name: str) -> None:  # type: ignore[no-untyped-def]
    """Remove a deleted version's ``lora_name`` from a node's engine and disk (its rows are already gone)."""
    from inference.gateway.models import Node
    from inference.gateway.node_client import NodeCallFailed, node_call

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return
    try:
        node_call(node, "/v1/adapters/unload", {"lora_name": lora_name, "purge": True})
    except NodeCallFailed as exc:
        if exc.code != "lora_not_found":  # already gone is done
            raise self.retry(exc=exc) from exc


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


@shared_task(ignore_result=True)
def validation_sweep_task() -> None:
    """Periodic (beat): re-enqueue versions stuck in ``uploaded``/``validating`` (``adapters_app.purge.sweep``)."""
    from adapters_app.purge import sweep

    sweep(adapter_version_validate_task.delay)


@shared_task(ignore_result=True, acks_late=True)
def purge_run_task(purge_id: int) -> None:
    """Run one durable cleanup now; a failure is retried by ``purge_reconcile_task`` with backoff."""
    from adapters_app.purge import purge_run

    purge_run(purge_id)


@shared_task(ignore_result=True)
def purge_reconcile_task() -> None:
    """Periodic (beat): run every cleanup whose next attempt is due, until each succeeds."""
    from adapters_app.purge import purge_run, purges_due

    for purge_id in purges_due():
        purge_run(purge_id)


@shared_task(ignore_result=True)
def gc_s3_orphans_task() -> None:
    """Periodic (beat): schedule deletion of S3 objects no version references."""
    from adapters_app.purge import s3_orphans_collect

    s3_orphans_collect()


@shared_task(ignore_result=True, max_retries=0)
def usage_drain_task() -> None:
    """Beat, every second: move metered usage from the Redis stream into PostgreSQL (``metering.usage_drain``)."""
    from inference.gateway.metering import usage_drain

    usage_drain()
