"""Reads for metering, scoped by tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet, Sum

from inference.gateway.models import UsageRecord


def usage_summary(records: QuerySet[UsageRecord], *, since: datetime | None = None) -> list[dict[str, Any]]:
    """Token totals per (adapter, version) over an already tenant-scoped ``records`` queryset.

    Returns:
        ``[{"model", "adapter", "version", "requests", "prompt_tokens", "completion_tokens"}]``; ``adapter`` and
        ``version`` are None for base-model requests, ``model`` is what the application sent. Sorted by model, version.
    """
    if since is not None:
        records = records.filter(created_at__gte=since)
    rows = (
        records.values("adapter_version__adapter__name", "adapter_version__number", "base_model__base_model_name")
        .annotate(requests=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))
        .order_by("adapter_version__adapter__name", "adapter_version__number")
    )
    return [
        {
            "model": r["adapter_version__adapter__name"] or r["base_model__base_model_name"],
            "adapter": r["adapter_version__adapter__name"],
            "version": r["adapter_version__number"],
            "requests": r["requests"],
            "prompt_tokens": r["prompt_tokens"] or 0,
            "completion_tokens": r["completion_tokens"] or 0,
        }
        for r in rows
    ]
