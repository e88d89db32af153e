"""Celery tasks of the adapter registry: thin and idempotent; they take ids, fetch rows, call services (conventions §8).

Services enqueue these tasks by name (``workers.enqueue``, names in ``workers.schedule``), so this module imports
them at the top and no import runs the other way.
"""

from __future__ import annotations

import logging

from botocore.exceptions import BotoCoreError, ClientError
from celery import shared_task
from django.db import InterfaceError, OperationalError

from adapters_app.direct_upload import upload_verify, uploads_sweep
from adapters_app.models import AdapterVersion
from adapters_app.purge import purge_run, purges_due, s3_orphans_collect, sweep
from adapters_app.services import adapter_version_fail, adapter_version_validate
from adapters_app.serving import serving_on_ready
from adapters_app.signals import version_ready
from common.exceptions import QuiverError
from workers import schedule

logger = logging.getLogger(__name__)


VALIDATE_RETRIES = 5


@shared_task(name=schedule.VALIDATE, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=VALIDATE_RETRIES)
def adapter_version_validate_task(self, version_id: int) -> None:  # type: ignore[no-untyped-def]
    """Validate a version; on ``ready`` send :data:`adapters_app.signals.version_ready` (the fleet places it), then
    apply the serving rule's on-ready step (``adapters_app.serving.serving_on_ready``).

    ``acks_late`` is safe: the status row guards reruns. Storage or disk trouble is retried with exponential backoff
    (5, 10, 20, 40, 80 s); once retries are spent the version ends ``rejected`` with ``validation_unavailable``
    rather than staying ``validating``. A database error (PostgreSQL restarting) is retried too, never rejected.
    """
    # The database restarting or unreachable: nothing is wrong with the upload. Retried (2 … 32 s); once retries
    # are spent the version stays claimed and the sweeper re-sends it.
    db_down = (OperationalError, InterfaceError)
    try:
        version = AdapterVersion.objects.select_related("adapter__base_model", "adapter__tenant").filter(
            pk=version_id).first()
    except db_down as exc:
        raise self.retry(exc=exc, countdown=2 * 2**self.request.retries) from exc
    if version is None:
        return
    try:
        version = adapter_version_validate(version)
    except db_down as exc:
        raise self.retry(exc=exc, countdown=2 * 2**self.request.retries) from exc
    except (BotoCoreError, ClientError, OSError) as exc:
        if self.request.retries >= VALIDATE_RETRIES:
            adapter_version_fail(version, code="validation_unavailable",
                                 message="The stored files could not be read for validation.",
                                 hint="Upload the same files again to retry.")
            return
        raise self.retry(exc=exc, countdown=5 * 2**self.request.retries) from exc
    if version.status == AdapterVersion.Status.READY:
        version_ready.send(sender=AdapterVersion, version=version)
        # After the fleet placed it: a promotion the upload asked for waits for that warm (adapters_app.serving).
        try:
            serving_on_ready(version)
        except QuiverError as exc:  # a concurrent promote won the row lock: its rule stands, nothing to retry
            logger.warning("adapter_version.on_ready_skipped", extra={"version_id": version.pk, "code": exc.code})


@shared_task(name=schedule.VALIDATION_SWEEP, ignore_result=True)
def validation_sweep_task() -> None:
    """Periodic (beat): re-enqueue versions stuck in ``uploaded``/``validating`` (``adapters_app.purge.sweep``)."""
    sweep(adapter_version_validate_task.delay)


@shared_task(name=schedule.PURGE_RUN, ignore_result=True, acks_late=True)
def purge_run_task(purge_id: int) -> None:
    """Run one durable cleanup now; a failure is retried by ``purge_reconcile_task`` with backoff."""
    purge_run(purge_id)


@shared_task(name=schedule.PURGE_RECONCILE, ignore_result=True)
def purge_reconcile_task() -> None:
    """Periodic (beat): run every cleanup whose next attempt is due, until each succeeds."""
    for purge_id in purges_due():
        purge_run(purge_id)


@shared_task(name=schedule.GC_S3_ORPHANS, ignore_result=True)
def gc_s3_orphans_task() -> None:
    """Periodic (beat): schedule deletion of S3 objects no version references."""
    s3_orphans_collect()


@shared_task(name=schedule.UPLOAD_VERIFY, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=VALIDATE_RETRIES,
             ignore_result=True)
def upload_verify_task(self, upload_id: int) -> None:  # type: ignore[no-untyped-def]
    """Check a browser-direct upload's sha256s and record its version (``direct_upload.upload_verify``).

    Storage trouble is retried with backoff (5 … 80 s); the sweeper re-sends a verification whose worker died.
    """
    try:
        upload_verify(upload_id)
    except (BotoCoreError, ClientError, OSError) as exc:
        raise self.retry(exc=exc, countdown=5 * 2**self.request.retries) from exc


@shared_task(name=schedule.UPLOAD_SWEEP, ignore_result=True)
def upload_sweep_task() -> None:
    """Periodic (beat): abort expired or orphaned browser-direct uploads, re-send stuck verifications."""
    uploads_sweep()
