"""Usage over time for the console's charts: requests, tokens, errors and mean latency per model per bucket."""

from __future__ import annotations

from datetime import datetime
from itertools import chain
from typing import Any

from django.db.models import Avg, Count, F, Q, QuerySet, Sum
from django.db.models.functions import TruncHour, TruncMinute

from inference.metering.hours import add_up, split
from inference.metering.models import UsageHour, UsageRecord

BUCKETS = {"minute": TruncMinute, "hour": TruncHour}


def usage_series(records: QuerySet[UsageRecord], *, since: datetime, bucket: str = "minute",
                 hours: QuerySet[UsageHour] | None = None) -> list[dict[str, Any]]:
    """Per (bucket start, model) totals over an already tenant-scoped ``records`` queryset, oldest first.

    Hourly buckets given ``hours`` (scoped as ``records``) come from those sums for the whole final hours
    (``inference.metering.hours``) and from the records for the rest: the same figures, without reading a year of
    records.

    Args:
        since: first instant counted (aware datetime).
        bucket: ``"minute"`` or ``"hour"`` (OpenAI's usage API uses ``bucket_width`` 1m / 1h / 1d).

    Returns:
        ``[{"t": ISO 8601, "model", "requests", "failures" (status >= 400), "prompt_tokens", "completion_tokens",
        "latency_ms_avg"}]``.

    Raises:
        KeyError: unknown ``bucket``.
    """
    trunc = BUCKETS[bucket]
    if hours is not None and bucket == "hour":
        return _hourly_split(records, hours, since=since)
    rows = (
        records.filter(created_at__gte=since)
        .annotate(t=trunc("created_at"))
        .values("t", "model_name")
        .annotate(requests=Count("id"), failures=Count("id", filter=Q(status_code__gte=400)),
                  prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
                  latency_ms_avg=Avg("latency_ms"))
        .order_by("t", "model_name")
    )
    return [
        {"t": r["t"].isoformat(), "model": r["model_name"], "requests": r["requests"], "failures": r["failures"],
         "prompt_tokens": r["prompt_tokens"] or 0, "completion_tokens": r["completion_tokens"] or 0,
         "latency_ms_avg": round(r["latency_ms_avg"] or 0.0, 1)}
        for r in rows
    ]


def _hourly_split(records: QuerySet[UsageRecord], hours: QuerySet[UsageHour], *,
                  since: datetime) -> list[dict[str, Any]]:
    part = split(records, hours, since=since, until=None)
    raw = part.records.annotate(t=TruncHour("created_at")).values("t", "model_name").annotate(
        n=Count("id"), f=Count("id", filter=Q(status_code__gte=400)), p=Sum("prompt_tokens"),
        c=Sum("completion_tokens"), lat=Sum("latency_ms"))
    summed = part.hours.annotate(t=F("hour")).values("t", "model_name").annotate(  # one key name for both parts
        n=Sum("requests"), f=Sum("errors"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"),
        lat=Sum("latency_sum_ms"))
    sums = add_up(chain(raw, summed), ("t", "model_name"), ("n", "f", "p", "c", "lat"))
    return [
        {"t": t.isoformat(), "model": model, "requests": int(r["n"]), "failures": int(r["f"]),
         "prompt_tokens": int(r["p"]), "completion_tokens": int(r["c"]),
         "latency_ms_avg": round(r["lat"] / r["n"] if r["n"] else 0.0, 1)}
        for (t, model), r in sorted(sums.items(), key=lambda item: item[0])
    ]
