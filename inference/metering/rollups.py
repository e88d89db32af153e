"""Per-minute usage rollups per tenant and adapter version, and the retention of raw usage records.

``usage_rollup`` (Celery beat, every minute) recomputes every minute inside ``QUIVER_USAGE_ROLLUP_LOOKBACK_S`` from
the raw :class:`~inference.gateway.models.UsageRecord` rows: requests, errors (status >= 400), tokens, latency
p50/p95 and TTFT p50/p95 (PostgreSQL ``percentile_cont``; computed in Python on other databases). Recomputing a
window (delete, then insert, in one transaction) makes a rerun or an overlapping run harmless and lets late records
count. ``usage_retention_purge`` (beat, hourly) deletes raw records older than ``QUIVER_USAGE_RETENTION_DAYS``;
rollups stay, so long-range usage reads come from them.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Aggregate, Count, FloatField, Max, Q, QuerySet, Sum
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from inference.metering.models import UsageHour, UsageRecord, UsageRollup

logger = logging.getLogger(__name__)
GROUP = ("tenant_id", "minute", "model_name", "version_number")
# Serialises rollup runs on PostgreSQL (two beat ticks overlapping would otherwise both insert a window).
ADVISORY_LOCK = 7_000_001
DELETE_BATCH = 5000


class _Percentile(Aggregate):
    """PostgreSQL ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expr)``; NULLs are ignored."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: str, fraction: float) -> None:
        super().__init__(expression, fraction=float(fraction), output_field=FloatField())


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear-interpolation percentile (as PostgreSQL's ``percentile_cont``) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = fraction * (len(ordered) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _rows_postgres(records: QuerySet[UsageRecord]) -> list[dict[str, Any]]:
    return list(records.values(*GROUP).annotate(
        requests=Count("id"), errors=Count("id", filter=Q(status_code__gte=400)),
        prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
        latency_p50_ms=_Percentile("latency_ms", 0.5), latency_p95_ms=_Percentile("latency_ms", 0.95),
        ttft_p50_ms=_Percentile("ttft_ms", 0.5), ttft_p95_ms=_Percentile("ttft_ms", 0.95),
    ))


def _rows_python(records: QuerySet[UsageRecord]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[tuple[int, int, int, float, float | None]]] = defaultdict(list)
    for *key, status, prompt, completion, latency, ttft in records.values_list(
            *GROUP, "status_code", "prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms"):
        groups[tuple(key)].append((status, prompt, completion, latency, ttft))
    rows = []
    for key, items in groups.items():
        latencies = [i[3] for i in items]
        ttfts = [i[4] for i in items if i[4] is not None]
        rows.append({**dict(zip(GROUP, key, strict=True)), "requests": len(items),
                     "errors": sum(1 for i in items if i[0] >= 400), "prompt_tokens": sum(i[1] for i in items),
                     "completion_tokens": sum(i[2] for i in items), "latency_p50_ms": percentile(latencies, 0.5),
                     "latency_p95_ms": percentile(latencies, 0.95), "ttft_p50_ms": percentile(ttfts, 0.5),
                     "ttft_p95_ms": percentile(ttfts, 0.95)})
    return rows


def _version_ids(records: QuerySet[UsageRecord]) -> dict[tuple[Any, ...], int]:
    """(tenant, model name, version number) → the adapter version's id, while that version still exists."""
    pairs = records.filter(adapter_version__isnull=False).values_list(
        "tenant_id", "model_name", "version_number", "adapter_version_id").distinct()
    return {(t, m, v): pk for t, m, v, pk in pairs}


def usage_rollup(*, now: datetime | None = None) -> int:
    """Recompute the rollups of every minute from ``now - QUIVER_USAGE_ROLLUP_LOOKBACK_S`` (floored to the minute)
    up to and including the current, still open, minute, and the :class:`UsageHour` sums of every hour from the one
    holding that window's start. Returns how many minute rollup rows the window now holds.

    Idempotent: the window's rows are replaced in one transaction.
    """
    now = now or timezone.now()
    start = (now - timedelta(seconds=settings.QUIVER_USAGE_ROLLUP_LOOKBACK_S)).replace(second=0, microsecond=0)
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])
        records = UsageRecord.objects.filter(created_at__gte=start).annotate(minute=TruncMinute("created_at"))
        rows = _rows_postgres(records) if connection.vendor == "postgresql" else _rows_python(records)
        versions = _version_ids(records)
        UsageRollup.objects.filter(minute__gte=start).delete()
        UsageRollup.objects.bulk_create([
            UsageRollup(
                tenant_id=r["tenant_id"], minute=r["minute"], model_name=r["model_name"],
                version_number=r["version_number"],
                adapter_version_id=versions.get((r["tenant_id"], r["model_name"], r["version_number"])),
                requests=r["requests"], errors=r["errors"], prompt_tokens=r["prompt_tokens"] or 0,
                completion_tokens=r["completion_tokens"] or 0, latency_p50_ms=r["latency_p50_ms"] or 0.0,
                latency_p95_ms=r["latency_p95_ms"] or 0.0, ttft_p50_ms=r["ttft_p50_ms"],
                ttft_p95_ms=r["ttft_p95_ms"])
            for r in rows
        ], batch_size=1000)
        _hours_replace(start.replace(minute=0))
    return len(rows)


def _hours_replace(first_hour: datetime) -> None:
    """Recompute :class:`UsageHour` from ``first_hour`` on, from the raw records (inside the caller's transaction)."""
    rows = (UsageRecord.objects.filter(created_at__gte=first_hour).annotate(hour=TruncHour("created_at"))
            .values("tenant_id", "hour", "model_name", "version_number")
            .annotate(requests=Count("id"), errors=Count("id", filter=Q(status_code__gte=400)),
                      prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
                      latency_sum_ms=Sum("latency_ms"), version_id=Max("adapter_version_id"))
            .order_by())
    UsageHour.objects.filter(hour__gte=first_hour).delete()
    UsageHour.objects.bulk_create([UsageHour(adapter_version_id=r["version_id"],
                                             **{k: v for k, v in r.items() if k != "version_id"}) for r in rows],
                                  batch_size=1000)


def usage_retention_purge(*, now: datetime | None = None) -> int:
    """Delete raw usage records older than ``QUIVER_USAGE_RETENTION_DAYS`` (none when 0), in batches of
    ``DELETE_BATCH`` so no long lock is held; returns how many were deleted.

    Raises:
        ValueError: a retention shorter than the rollup lookback (records would go before their minute is final).
    """
    days = settings.QUIVER_USAGE_RETENTION_DAYS
    if days <= 0:
        return 0
    if days * 86400 <= settings.QUIVER_USAGE_ROLLUP_LOOKBACK_S:
        raise ValueError(f"QUIVER_USAGE_RETENTION_DAYS={days} must exceed QUIVER_USAGE_ROLLUP_LOOKBACK_S; raise it "
                         "or set 0 to keep raw records.")
    cutoff = (now or timezone.now()) - timedelta(days=days)
    total = 0
    # Each batch chosen and deleted by the database in one statement: fetching 5,000 ids into Python and sending them
    # back as parameters cost ~50 ms of CPU a batch, 76 s for the 7.5 million rows a year of seeded usage left past
    # 90 days (fleet_scale), all of it holding the GIL of the worker whose threads wait on node agents.
    table = connection.ops.quote_name(UsageRecord._meta.db_table)
    pk = connection.ops.quote_name(UsageRecord._meta.pk.column or "id")
    sql = f"DELETE FROM {table} WHERE {pk} IN (SELECT {pk} FROM {table} WHERE created_at < %s LIMIT %s)"  # noqa: S608
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [cutoff, DELETE_BATCH])
            deleted = cursor.rowcount
        if deleted <= 0:
            break
        total += deleted
    if total:
        logger.info("usage.retention_purged", extra={"deleted": total, "cutoff": cutoff.isoformat()})
    return total


def usage_rollups(rollups: QuerySet[UsageRollup], *, since: datetime, until: datetime | None = None,
                  model: str | None = None) -> list[dict[str, Any]]:
    """Rollup rows of an already tenant-scoped ``rollups`` queryset in ``[since, until)``, oldest first.

    Returns:
        ``[{"minute": ISO 8601, "model", "version", "requests", "failures" (status >= 400), "prompt_tokens",
        "completion_tokens", "latency_p50_ms", "latency_p95_ms", "ttft_p50_ms", "ttft_p95_ms"}]``; ``version``
        None = the base model.
    """
    rows = rollups.filter(minute__gte=since)
    if until is not None:
        rows = rows.filter(minute__lt=until)
    if model:
        rows = rows.filter(model_name=model)
    return [
        {"minute": r.minute.isoformat(), "model": r.model_name, "version": r.version_number, "requests": r.requests,
         "failures": r.errors, "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
         "latency_p50_ms": round(r.latency_p50_ms, 3), "latency_p95_ms": round(r.latency_p95_ms, 3),
         "ttft_p50_ms": None if r.ttft_p50_ms is None else round(r.ttft_p50_ms, 3),
         "ttft_p95_ms": None if r.ttft_p95_ms is None else round(r.ttft_p95_ms, 3)}
        for r in rows.order_by("minute", "model_name", "version_number")
    ]
