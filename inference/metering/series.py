"""Usage over time for the console's charts: requests, tokens, errors and mean latency per model per bucket."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Avg, Count, Q, QuerySet, Sum
from django.db.models.functions import TruncHour, TruncMinute

from inference.metering.models import UsageRecord

BUCKETS = {"minute": TruncMinute, "hour": TruncHour}


def usage_series(records: QuerySet[UsageRecord], *, since: datetime, bucket: str = "minute") -> list[dict[str, Any]]:
    """Per (bucket start, model) totals over an already tenant-scoped ``records`` queryset, oldest first.

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
