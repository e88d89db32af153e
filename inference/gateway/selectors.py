"""Reads for metering, scoped by tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet, Sum

from inference.gateway.models import UsageRecord


def usage_summary(records: QuerySet[UsageRecord], *, since: datetime | None = None) -> list[dict[str, Any]]:
    """Token totals per (model, version) over an already tenant-scoped ``records`` queryset.

    Names are those recorded at request time, so usage of a since-deleted adapter still counts under its name.

    Returns:
        ``[{"model", "adapter", "version", "requests", "prompt_tokens", "completion_tokens"}]``; ``adapter`` and
        ``version`` are None for base-model requests, ``model`` is what the application sent. Sorted by model, version.
    """
    if since is not None:
        records = records.filter(created_at__gte=since)
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
