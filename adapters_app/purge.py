"""Nothing stuck, nothing orphaned: durable cleanups, the validation sweeper, and garbage collection.

- **Purges** (``Purge`` rows) are written in the same transaction that makes objects garbage (an adapter's delete),
  run at once on commit, and retried by a beat reconciler with exponential backoff (10 s doubling, at most 1 h)
  until they succeed, however long S3 or a node is down. Each is idempotent: deleting a missing S3 key or unloading
  an adapter a node no longer has counts as done.
- **The sweeper** re-enqueues versions left ``uploaded`` (the enqueue at commit was lost) or ``validating`` longer
  than a task's hard time limit (the worker died); the status claim makes a duplicate run harmless.
- **Garbage collection** finds S3 objects under ``tenants/`` that no version references (a failed upload whose
  cleanup could not reach S3), and adapter copies a node reports that no version owns; both become purges.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Iterable
from datetime import timedelta

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters_app import storage
from adapters_app.models import AdapterVersion, Purge, Upload
from adapters_app.signals import NodeCopyDropFailed, fleet_port
from workers import schedule
from workers.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)
BACKOFF_FIRST_S = 10
BACKOFF_MAX_S = 3600
GC_ORPHAN_COPY = "gc_orphan_copy"  # reason of a node copy no version owned when its node reported it
S3_BATCH = 1000
# A node's report of copies no version owns (``purge_node_orphans``): new purges recorded per report, and the most
# left pending on one node. A report lists up to 10,000 adapters; one purge row, one query and one task each made a
# forged report of 10,000 made-up names take 17 s (then longer as the rows grew), every heartbeat.
NODE_ORPHANS_PER_REPORT = 64
NODE_PENDING_MAX = 1000


def _enqueue_on_commit(purges: Iterable[Purge]) -> None:
    for purge in purges:
        enqueue_on_commit(schedule.PURGE_RUN, purge.pk)


def _run_on_commit(purges: Iterable[Purge]) -> None:
    # S3 deletes are quick: done in-process right after the commit; a failure is left to the reconciler.
    for purge in purges:
        transaction.on_commit(functools.partial(purge_run, purge.pk))


def purge_s3_keys(keys: Iterable[str], *, reason: str) -> list[Purge]:
    """Record S3 keys to delete (batches of 1,000) and try them right after commit. Call inside the transaction that
    makes them garbage."""
    keys = sorted(set(keys))
    now = timezone.now()
    purges = [Purge.objects.create(kind=Purge.Kind.S3, s3_keys=keys[i:i + S3_BATCH], reason=reason,
                                   next_attempt_at=now) for i in range(0, len(keys), S3_BATCH)]
    _run_on_commit(purges)
    return purges


def purge_node_copy(node_id: int, lora_name: str, *, reason: str) -> Purge | None:
    """Record that node ``node_id`` must drop ``lora_name`` (engine and disk), sent to a worker on commit; None when
    one is already pending."""
    if Purge.objects.filter(kind=Purge.Kind.NODE, node_id=node_id, lora_name=lora_name, done_at=None).exists():
        return None
    purge = Purge.objects.create(kind=Purge.Kind.NODE, node_id=node_id, lora_name=lora_name, reason=reason,
                                 next_attempt_at=timezone.now())
    _enqueue_on_commit([purge])
    return purge


def purge_node_orphans(node_id: int, lora_names: Collection[str]) -> list[Purge]:
    """Record that node ``node_id`` must drop the copies ``lora_names`` it reported and no version owns (garbage
    collection, reason ``gc_orphan_copy``), sent to workers on commit.

    Bounded, because the names come from the node: one query for those already pending, at most
    ``NODE_ORPHANS_PER_REPORT`` new ones per call (the node reports the rest again until they are dropped), and none
    while ``NODE_PENDING_MAX`` are pending on that node.

    Returns:
        The purges recorded now.
    """
    if not lora_names:
        return []
    pending = Purge.objects.filter(kind=Purge.Kind.NODE, node_id=node_id, done_at=None)
    known = set(pending.filter(lora_name__in=list(lora_names)).values_list("lora_name", flat=True))
    new = sorted(set(lora_names) - known)[:NODE_ORPHANS_PER_REPORT]
    if not new:
        return []
    new = new[:max(0, NODE_PENDING_MAX - pending.count())]
    now = timezone.now()
    purges = Purge.objects.bulk_create([Purge(kind=Purge.Kind.NODE, node_id=node_id, lora_name=name,
                                              reason=GC_ORPHAN_COPY, next_attempt_at=now) for name in new])
    _enqueue_on_commit(purges)
    return purges


def _name_owned(lora_name: str) -> bool:
    """Whether a version's ``served_name`` is ``lora_name`` now (its suffix is the version pk)."""
    _, _, pk = lora_name.rpartition("--")
    version = (AdapterVersion.objects.select_related("adapter__tenant").filter(pk=int(pk)).first()
               if pk.isdigit() else None)
    return version is not None and version.served_name == lora_name


def _run_node(purge: Purge) -> None:
    if purge.node_id is None:
        return  # the node is gone, and its disk with it
    if purge.reason == GC_ORPHAN_COPY and _name_owned(purge.lora_name):
        # Recorded while no version owned the name (a node's disk older than a restored or reset database), but one
        # does now: dropping it would pull a served adapter from under in-flight requests and crash the engine.
        logger.warning("purge.orphan_owned_again", extra={"purge_id": purge.pk, "lora_name": purge.lora_name})
        return
    fleet_port().node_copy_drop(purge.node_id, purge.lora_name)


def purge_run(purge_id: int) -> bool:
    """Try one purge now. Returns True when it is done (now or before); failures schedule the next attempt.

    Concurrent runs of one purge are serialised by a row lock taken with ``skip_locked`` (a busy row is left to
    its current runner).
    """
    with transaction.atomic():
        purge = Purge.objects.select_for_update(skip_locked=True).filter(pk=purge_id, done_at=None).first()
        if purge is None:
            return not Purge.objects.filter(pk=purge_id, done_at=None).exists()
        try:
            if purge.kind == Purge.Kind.S3:
                storage.delete_keys(purge.s3_keys)
            else:
                _run_node(purge)
        except (BotoCoreError, ClientError, NodeCopyDropFailed, OSError) as exc:
            purge.attempts += 1
            delay = min(BACKOFF_FIRST_S * 2 ** (purge.attempts - 1), BACKOFF_MAX_S)
            purge.next_attempt_at = timezone.now() + timedelta(seconds=delay)
            purge.last_error = str(exc)[:2000]
            purge.save(update_fields=["attempts", "next_attempt_at", "last_error"])
            logger.warning("purge.failed", extra={"purge_id": purge.pk, "kind": purge.kind, "attempts": purge.attempts})
            return False
        purge.done_at = timezone.now()
        purge.save(update_fields=["done_at"])
    logger.info("purge.done", extra={"purge_id": purge_id, "kind": purge.kind, "reason": purge.reason})
    return True


def purges_due(*, limit: int = 200) -> list[int]:
    """Ids of unfinished purges whose next attempt is due, oldest first."""
    return list(Purge.objects.filter(done_at=None, next_attempt_at__lte=timezone.now())
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])


def versions_stuck(*, limit: int = 200) -> list[int]:
    """Ids of versions to re-enqueue: ``uploaded`` for over ``QUIVER_SWEEP_UPLOADED_AFTER_S``, or ``validating``
    with a claim older than the task's hard time limit plus a minute (its worker is gone)."""
    now = timezone.now()
    uploaded = now - timedelta(seconds=settings.QUIVER_SWEEP_UPLOADED_AFTER_S)
    claimed = now - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 60)
    status = AdapterVersion.Status
    stuck = (AdapterVersion.objects.filter(status=status.UPLOADED, created_at__lt=uploaded,
                                           validation_claimed_at=None)
             | AdapterVersion.objects.filter(status=status.UPLOADED, validation_claimed_at__lt=claimed)
             | AdapterVersion.objects.filter(status=status.VALIDATING, validation_claimed_at__lt=claimed)
             | AdapterVersion.objects.filter(status=status.VALIDATING, validation_claimed_at=None))
    return list(stuck.order_by("pk").values_list("pk", flat=True)[:limit])


def sweep(enqueue: Callable[[int], object]) -> int:
    """Re-enqueue every stuck version with ``enqueue(version_id)``; returns how many."""
    ids = versions_stuck()
    for version_id in ids:
        enqueue(version_id)
    if ids:
        logger.warning("validation.swept", extra={"versions": ids})
    return len(ids)


def s3_orphans_collect(*, grace_s: int | None = None) -> int:
    """Purge S3 objects under ``tenants/`` that no version references and that are older than ``grace_s``
    (default ``QUIVER_GC_GRACE_S``; uploads in flight are younger). Returns how many keys were scheduled."""
    grace = timedelta(seconds=settings.QUIVER_GC_GRACE_S if grace_s is None else grace_s)
    cutoff = timezone.now() - grace
    referenced = {f["s3_key"] for files in AdapterVersion.objects.values_list("files", flat=True) for f in files or []}
    pending = {k for keys in Purge.objects.filter(kind=Purge.Kind.S3, done_at=None).values_list("s3_keys", flat=True)
               for k in keys}
    # Browser-direct uploads still open or being verified own their objects until they finish or are swept.
    live = {f["key"] for files in Upload.objects.filter(state__in=[Upload.State.OPEN, Upload.State.VERIFYING])
            .values_list("files", flat=True) for f in files}
    orphans = [key for key, modified in storage.list_objects("tenants/")
               if modified < cutoff and key not in referenced and key not in pending and key not in live]
    if orphans:
        with transaction.atomic():
            purge_s3_keys(orphans, reason="gc_orphan_object")
        logger.warning("gc.s3_orphans", extra={"keys": len(orphans)})
    return len(orphans)
