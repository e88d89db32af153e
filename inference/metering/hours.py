"""Split a usage read's period between the hourly sums (:class:`~inference.metering.models.UsageHour`) and the raw
records, so a year-long read adds up ~9,000 hours per model instead of millions of records.

Only whole UTC hours that ended before ``now - QUIVER_USAGE_ROLLUP_LOOKBACK_S`` come from the sums: those are final
(``rollups.usage_rollup`` no longer rewrites them), so the answer is the same as from the raw records alone while the
records are kept. The period's partial first and last hours, and the recent ones, are read raw. Past
``QUIVER_USAGE_RETENTION_DAYS`` the sums still count what the purge deleted (usage is billed from them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from inference.metering.models import UsageHour, UsageRecord

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Split:
    """``records``: the raw part (already filtered to the period, minus the hours); ``hours``: the sums' part."""

    records: QuerySet[UsageRecord]
    hours: QuerySet[UsageHour]


def _floor(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def split(records: QuerySet[UsageRecord], hours: QuerySet[UsageHour], *, since: datetime | None,
          until: datetime | None, now: datetime | None = None) -> Split:
    """Both querysets (already scoped alike: tenant, key's adapters) narrowed to ``[since, until)`` (None: open).

    The hours part is ``[lo, hi)``: ``lo`` = ``since`` rounded up to the hour (None: from the first), ``hi`` = the
    earlier of ``until`` rounded down and the last final hour; the records part is the rest of the period.
    """
    final = _floor((now or timezone.now()) - timedelta(seconds=settings.QUIVER_USAGE_ROLLUP_LOOKBACK_S))
    lo = None if since is None else (since if since == _floor(since) else _floor(since) + HOUR)
    hi = final if until is None else min(final, _floor(until))
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    if lo is not None and lo >= hi:  # no whole final hour inside: all of it raw
        return Split(records, hours.none())
    inside = Q(created_at__lt=hi) if lo is None else Q(created_at__gte=lo, created_at__lt=hi)
    hours = hours.filter(hour__lt=hi) if lo is None else hours.filter(hour__gte=lo, hour__lt=hi)
    return Split(records.exclude(inside), hours)


def add_up(rows: Iterable[Mapping[str, Any]], keys: Sequence[str],
           fields: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The sums of ``fields`` per distinct ``keys`` over grouped rows from both parts of a :class:`Split` (a group
    can have a row in each): ``{key values: {each key, each field}}``, in first-seen order; a null field counts 0."""
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[k] for k in keys)
        acc = sums.get(key)
        if acc is None:
            acc = sums[key] = {**{k: r[k] for k in keys}, **dict.fromkeys(fields, 0)}
        for f in fields:
            acc[f] += r[f] or 0
    return sums
