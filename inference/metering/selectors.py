"""Reads for metering, scoped by tenant."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet, Sum

from inference.metering.models import UsageRecord


def usage_summary(records: QuerySet[UsageRecord], *, since: datetime | None = None,
                  until: datetime | None = None) -> list[dict[str, Any]]:
    """Token totals per (model, version) over an already tenant-scoped ``records`` queryset.

    Names are those recorded at request time, so usage of a since-deleted adapter still counts under its name.

    Returns:
        ``[{"model", "adapter", "version", "requests", "prompt_tokens", "completion_tokens"}]``; ``adapter`` and
        ``version`` are None for base-model requests, ``model`` is what the application sent. Sorted by model, version.
    """
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    rows = (
        records.values("model_name", "version_number")
        .annotate(requests=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
        .order_by("model_name", "version_number")
    )
    return [
        {
            "model": r["model_name"],
            "adapter": r["model_name"] if r["version_number"] is not None else None,
            "version": r["version_number"],
            "requests": r["requests"],
            "prompt_tokens": r["prompt_tokens"] or 0,
            "completion_tokens": r["completion_tokens"] or 0,
        }
        for r in rows
    ]


CSV_FIELDS = ("created_at", "model", "version", "endpoint", "stream", "status_code", "prompt_tokens",
              "completion_tokens", "latency_ms", "ttft_ms")


def usage_csv(records: QuerySet[UsageRecord], *, since: datetime | None, until: datetime | None) -> Iterator[str]:
    """Raw usage records of an already tenant-scoped queryset in ``[since, until)`` as CSV lines (header first),
    oldest first; ``status_code`` 499 = client went away, 502 = the engine's stream was cut."""
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_FIELDS)
    yield _take(out)
    rows = records.order_by("created_at", "pk").values_list(
        "created_at", "model_name", "version_number", "endpoint", "stream", "status_code", "prompt_tokens",
        "completion_tokens", "latency_ms", "ttft_ms")
    for row in rows.iterator(chunk_size=2000):
        writer.writerow([row[0].isoformat(), *row[1:]])
        yield _take(out)


def _take(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate(0)
    return text
