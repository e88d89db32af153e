"""Per-version figures side by side: how each version of one adapter did over a period (the canary view).

For an adapter, one row per version in its serving rule or with traffic in ``[since, until)`` (requests by name and
by ``name@N`` alike): requests, errors (status >= 400), TTFT and latency p50/p95, tokens, and the version's weight
in the rule now. Read from ``UsageRecord`` like ``inference.metering.traffic`` (percentiles in PostgreSQL, in Python
on SQLite).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Sum

from adapters_app.models import Adapter, AdapterVersion
from inference.metering.hours import split
from inference.metering.models import UsageHour, UsageRecord
from inference.metering.traffic import Percentile, latest, percentile

WANTED = {"ttft_ms_p50": ("ttft_ms", 0.5), "ttft_ms_p95": ("ttft_ms", 0.95),
          "latency_ms_p50": ("latency_ms", 0.5), "latency_ms_p95": ("latency_ms", 0.95)}


def version_figures(records: QuerySet[UsageRecord], *, adapter: Adapter, since: datetime,
                    until: datetime, hours: QuerySet[UsageHour] | None = None) -> list[dict[str, Any]]:
    """Each version's figures for ``adapter`` over ``records`` (already scoped to its tenant) in ``[since, until)``.

    Given ``hours`` (scoped as ``records``), counts and tokens of the whole final hours come from those sums
    (``inference.metering.hours``). Percentiles are over the period's latest ``traffic.PERCENTILE_ROWS`` records of
    the adapter (all of them below that).

    Returns:
        Rows by version number: ``{"version", "status", "weight" (its share of ``model=<name>`` now, 0 when out
        of the rule), "in_rule", "requests", "errors", "error_rate" (0..1, null without requests), "ttft_ms_p50",
        "ttft_ms_p95", "latency_ms_p50", "latency_ms_p95" (ms, null without data), "prompt_tokens",
        "completion_tokens"}``.
    """
    weights = {int(e[0]): int(e[1]) for e in (adapter.serving_rule or []) if isinstance(e, list) and len(e) == 2}
    # The version ids themselves, not a join on the adapter: PostgreSQL then estimates the rows from the column's
    # statistics (through the join it guessed 1 % of them, and sorted a whole month to find the latest).
    ids = list(AdapterVersion.objects.filter(adapter=adapter).values_list("pk", flat=True))
    scoped = records.filter(adapter_version_id__in=ids, created_at__gte=since, created_at__lt=until)
    counted: list[tuple[QuerySet[Any], Any, Any]] = [(scoped, Count("id"), Count("id", filter=Q(status_code__gte=400)))]
    if hours is not None:
        part = split(records.filter(adapter_version_id__in=ids), hours.filter(adapter_version_id__in=ids),
                     since=since, until=until)
        counted = [(part.records, Count("id"), Count("id", filter=Q(status_code__gte=400))),
                   (part.hours, Sum("requests"), Sum("errors"))]
    totals: dict[Any, dict[str, Any]] = {}
    for qs, requests, errors in counted:
        for r in qs.values("version_number").annotate(requests=requests, errors=errors, prompt=Sum("prompt_tokens"),
                                                      completion=Sum("completion_tokens")):
            t = totals.setdefault(r["version_number"], {"requests": 0, "errors": 0, "prompt": 0, "completion": 0})
            for k in ("requests", "errors", "prompt", "completion"):
                t[k] += r[k] or 0
    pcts: dict[Any, dict[str, float | None]] = {}
    if connection.vendor == "postgresql":
        for r in latest(scoped).values("version_number").annotate(
                **{k: Percentile(F(col), p) for k, (col, p) in WANTED.items()}):
            pcts[r["version_number"]] = {k: r[k] for k in WANTED}  # type: ignore[literal-required]
    else:
        samples: dict[Any, dict[str, list[float]]] = defaultdict(lambda: {"latency_ms": [], "ttft_ms": []})
        for number, latency, ttft in latest(scoped).values_list("version_number", "latency_ms", "ttft_ms"):
            samples[number]["latency_ms"].append(latency)
            if ttft is not None:
                samples[number]["ttft_ms"].append(ttft)
        pcts = {n: {k: percentile(s[col], p) for k, (col, p) in WANTED.items()} for n, s in samples.items()}
    numbers = sorted(set(weights) | {n for n in totals if n is not None})
    statuses = dict(AdapterVersion.objects.filter(adapter=adapter, number__in=numbers).values_list("number", "status"))
    rows = []
    for number in numbers:
        t = totals.get(number, {})
        requests = t.get("requests", 0)
        rows.append({
            "version": number, "status": statuses.get(number, "deleted"), "weight": weights.get(number, 0),
            "in_rule": weights.get(number, 0) > 0, "requests": requests, "errors": t.get("errors", 0),
            "error_rate": round(t.get("errors", 0) / requests, 4) if requests else None,
            **{k: None if v is None else round(v, 1) for k, v in pcts.get(number, dict.fromkeys(WANTED)).items()},
            "prompt_tokens": t.get("prompt") or 0, "completion_tokens": t.get("completion") or 0,
        })
    return rows
