"""Per-adapter traffic over a period, for the console's traffic tables and sparklines.

One row per (tenant, model as requested, version): requests, tokens, errors, latency and TTFT percentiles, and a
request-count sparkline per bucket. Read from ``UsageRecord`` (Quiver's own records), so the console needs no
Prometheus server. Percentiles run in PostgreSQL (``percentile_cont``); on SQLite (the embedded demo) they are
computed in Python over the period's rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Aggregate, Count, F, FloatField, Q, QuerySet, Sum
from django.db.models.functions import TruncHour, TruncMinute

from inference.metering.models import UsageRecord

BUCKETS: dict[str, tuple[Any, timedelta]] = {"minute": (TruncMinute, timedelta(minutes=1)),
                                             "hour": (TruncHour, timedelta(hours=1))}
MAX_BUCKETS = 1440
GROUP = ("tenant__slug", "model_name", "version_number")


class Percentile(Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expr)`` (continuous, interpolated)."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        """``fraction`` in [0, 1], e.g. 0.95 for p95."""
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear-interpolated percentile like ``percentile_cont``; None for no values."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * fraction
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _bucket_start(t: datetime, width: timedelta) -> datetime:
    if width >= timedelta(hours=1):
        return t.replace(minute=0, second=0, microsecond=0)
    return t.replace(second=0, microsecond=0)


def traffic_table(records: QuerySet[UsageRecord], *, since: datetime, until: datetime,
                  bucket: str = "minute") -> list[dict[str, Any]]:
    """Traffic per (tenant, model, version) over an already scoped ``records`` queryset in ``[since, until)``.

    Args:
        since, until: aware datetimes; the period (``until`` exclusive).
        bucket: sparkline width, ``"minute"`` or ``"hour"``.

    Returns:
        Rows sorted by requests (most first): ``{"tenant", "model", "version" (null = base model), "requests",
        "requests_per_s", "prompt_tokens", "completion_tokens", "tokens_per_s", "failures" (status >= 400),
        "latency_ms_p50", "latency_ms_p95", "latency_ms_p99", "ttft_ms_p50", "ttft_ms_p95" (ms, null without data),
        "spark": [requests per bucket from ``since``'s bucket to ``until``]}``.

    Raises:
        KeyError: unknown ``bucket``. ValueError: more than 1,440 buckets (pick a wider bucket).
    """
    trunc, width = BUCKETS[bucket]
    first = _bucket_start(since, width)
    n_buckets = max(1, math.ceil((until - first) / width))
    if n_buckets > MAX_BUCKETS:
        raise ValueError(f"{n_buckets} {bucket} buckets; at most {MAX_BUCKETS}: use a wider bucket")
    scoped = records.filter(created_at__gte=since, created_at__lt=until)
    seconds = max(1.0, (until - since).total_seconds())
    totals = scoped.values(*GROUP).annotate(
        requests=Count("id"), failures=Count("id", filter=Q(status_code__gte=400)),
        prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    pcts: dict[tuple[Any, ...], dict[str, float | None]] = {}
    wanted = {"latency_ms_p50": ("latency_ms", 0.5), "latency_ms_p95": ("latency_ms", 0.95),
              "latency_ms_p99": ("latency_ms", 0.99), "ttft_ms_p50": ("ttft_ms", 0.5),
              "ttft_ms_p95": ("ttft_ms", 0.95)}
    if connection.vendor == "postgresql":
        for r in scoped.values(*GROUP).annotate(**{k: Percentile(F(col), p) for k, (col, p) in wanted.items()}):
            pcts[tuple(r[g] for g in GROUP)] = {k: r[k] for k in wanted}
    else:
        samples: dict[tuple[Any, ...], dict[str, list[float]]] = defaultdict(lambda: {"latency_ms": [], "ttft_ms": []})
        for *key, latency, ttft in scoped.values_list(*GROUP, "latency_ms", "ttft_ms"):
            samples[tuple(key)]["latency_ms"].append(latency)
            if ttft is not None:
                samples[tuple(key)]["ttft_ms"].append(ttft)
        pcts = {key: {k: percentile(s[col], p) for k, (col, p) in wanted.items()} for key, s in samples.items()}
    spark: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0] * n_buckets)
    for r in scoped.annotate(b=trunc("created_at")).values(*GROUP, "b").annotate(n=Count("id")):
        i = int((r["b"] - first) / width)
        if 0 <= i < n_buckets:
            spark[tuple(r[g] for g in GROUP)][i] += r["n"]
    rows = []
    for r in totals:
        key = tuple(r[g] for g in GROUP)
        prompt, completion = r["prompt"] or 0, r["completion"] or 0
        rows.append({
            "tenant": r["tenant__slug"], "model": r["model_name"], "version": r["version_number"],
            "requests": r["requests"], "requests_per_s": round(r["requests"] / seconds, 4),
            "prompt_tokens": prompt, "completion_tokens": completion,
            "tokens_per_s": round((prompt + completion) / seconds, 3), "failures": r["failures"],
            **{k: None if v is None else round(v, 1) for k, v in pcts.get(key, dict.fromkeys(wanted)).items()},
            "spark": spark[key],
        })
    rows.sort(key=lambda x: (-x["requests"], x["tenant"], x["model"], x["version"] or 0))
    return rows
