"""Per-adapter traffic over a period, for the console's traffic tables and sparklines.

One row per (tenant, model as requested without a ``@N`` pin, version): requests, tokens, errors, latency and TTFT percentiles, and a
request-count sparkline per bucket. Read from ``UsageRecord`` (Quiver's own records; whole past hours from their
``UsageHour`` sums), so the console needs no Prometheus server. Percentiles run in PostgreSQL (``percentile_cont``);
on SQLite (the embedded demo) they are computed in Python over the period's rows.

A paged table (the operator's, every tenant) sorts every version's totals (:func:`traffic_totals`, one grouped read)
and computes percentiles for its page's versions only (:func:`with_percentiles`): the sort of the period's records
for percentiles was the cost of a day's table at 10 million records (docs/scale-usage.md, "Operator pages at 64 nodes").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import (
    Aggregate,
    Case,
    CharField,
    Count,
    DateTimeField,
    F,
    FloatField,
    Func,
    IntegerField,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Left, StrIndex, TruncHour, TruncMinute

from inference.metering.hours import add_up, split
from inference.metering.models import UsageHour, UsageRecord

BUCKETS: dict[str, tuple[Any, timedelta]] = {"minute": (TruncMinute, timedelta(minutes=1)),
                                             "hour": (TruncHour, timedelta(hours=1))}
MAX_BUCKETS = 1440
# Percentiles read at most this many of a period's records, its latest (a bounded sort: a month of a busy tenant is
# a million records, over a second of percentile work on 2 cores). Counts and tokens always cover the whole period.
PERCENTILE_ROWS = 50_000
GROUP = ("tenant_id", "tenant__slug", "adapter", "version_number")
# Percentiles group by the tenant's id, not its slug: no join with the tenants table, and an integer sort key for
# the ordered-set aggregate (its sort of the period's records was the cost of a day's table: docs/scale-usage.md).
PCT_GROUP = ("tenant_id", "adapter", "version_number")
WANTED = {"latency_ms_p50": ("latency_ms", 0.5), "latency_ms_p95": ("latency_ms", 0.95),
          "latency_ms_p99": ("latency_ms", 0.99), "ttft_ms_p50": ("ttft_ms", 0.5), "ttft_ms_p95": ("ttft_ms", 0.95)}
# What a paged table may be ordered by: figures every version's totals already carry (ordering by a percentile
# would need every version's percentiles, the cost paging leaves out).
ORDERINGS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "requests": itemgetter("requests"), "tokens_per_s": itemgetter("tokens_per_s"),
    "failures": itemgetter("failures"), "tenant": itemgetter("tenant"), "model": itemgetter("model")}
# The model as requested, without a ``@N`` pin: ``bot`` and ``bot@1`` reaching version 1 are one row, as the console
# says a version reads the same whichever way the application named it (two "bot v1" rows: a fresh user's finding).
ADAPTER = Case(When(model_name__contains="@", then=Left("model_name", StrIndex("model_name", Value("@")) - 1)),
               default=F("model_name"), output_field=CharField())


def _named(qs: QuerySet[Any]) -> QuerySet[Any]:
    return qs.annotate(adapter=ADAPTER)


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


def latest(scoped: QuerySet[UsageRecord], rows: int | None = None) -> QuerySet[UsageRecord]:
    """``scoped`` narrowed to its latest ``rows`` records (default :data:`PERCENTILE_ROWS`; ties at the cut all
    kept): the records percentiles are computed over. One index scan of ``rows`` entries finds the cut."""
    rows = PERCENTILE_ROWS if rows is None else rows
    cut = scoped.order_by("-created_at").values_list("created_at", flat=True)[rows - 1:rows]
    cut_at = next(iter(cut), None)
    return scoped if cut_at is None else scoped.filter(created_at__gte=cut_at)


class BucketIndex(Func):
    """PostgreSQL: which bucket of ``width`` from ``first`` a timestamp falls in, ``floor((t - first) / width)``, as
    an integer. The sparkline groups by it instead of ``date_trunc``: a truncated timestamp comes back as a datetime
    Django makes timezone-aware row by row, most of the Python time of a table with thousands of (version, minute)
    rows (2,000 versions over an hour: ~7,000 rows, ~40 ms of web CPU; docs/scale-usage.md)."""

    output_field = IntegerField()

    def __init__(self, expression: Any, first: datetime, width: timedelta) -> None:
        """``first``: an aware datetime (bucket 0's start); ``width``: the bucket width."""
        super().__init__(expression, Value(first, output_field=DateTimeField()),
                         Value(width.total_seconds(), output_field=FloatField()))

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        """``FLOOR(EXTRACT(EPOCH FROM (t - first)) / width_s)::integer`` (PostgreSQL only: the caller checks)."""
        (t_sql, t_params), (f_sql, f_params), (w_sql, w_params) = (compiler.compile(e) for e in self.source_expressions)
        return (f"FLOOR(EXTRACT(EPOCH FROM ({t_sql} - {f_sql})) / {w_sql})::integer",
                [*t_params, *f_params, *w_params])


def _per_version(cells: QuerySet[Any]) -> Iterator[dict[str, Any]]:
    """PostgreSQL: a ``(version, bucket)`` grouped read (``GROUP`` + ``b``, annotated ``requests``, ``failures``,
    ``prompt``, ``completion``) summed per version in the database, each with its buckets and their requests as two
    arrays: a row per version, not per (version, minute), is what Python then handles (1,577 against ~7,000 for
    2,000 versions over an hour). Yields ``{*GROUP, "requests", "failures", "prompt", "completion", "buckets",
    "counts"}``; nothing for an empty queryset."""
    try:
        sql, params = cells.query.sql_with_params()
    except EmptyResultSet:  # ``.none()``: no whole final hour in the period
        return
    # The inner query's output columns are named by ``values()``: the group's names, ``b`` and the annotations.
    wrapped = ('SELECT "tenant_id", "tenant__slug", "adapter", "version_number", SUM("requests")::bigint, '
               'SUM("failures")::bigint, SUM("prompt")::bigint, SUM("completion")::bigint, ARRAY_AGG("b"), '
               f'ARRAY_AGG("requests") FROM ({sql}) cells GROUP BY 1, 2, 3, 4')  # noqa: S608 - Django's own SQL
    with connection.cursor() as cursor:
        cursor.execute(wrapped, params)
        for (tenant_id, slug, adapter, version, requests, failures, prompt, completion, buckets,
             counts) in cursor.fetchall():
            yield {"tenant_id": tenant_id, "tenant__slug": slug, "adapter": adapter, "version_number": version,
                   "requests": requests, "failures": failures, "prompt": prompt, "completion": completion,
                   "buckets": buckets, "counts": counts}


def _bucket_start(t: datetime, width: timedelta) -> datetime:
    if width >= timedelta(hours=1):
        return t.replace(minute=0, second=0, microsecond=0)
    return t.replace(second=0, microsecond=0)


@dataclass(frozen=True)
class TrafficTotals:
    """A period's traffic per version before percentiles (:func:`traffic_totals`): ``rows`` (by requests, most
    first) carry every field of a table row but the percentiles, plus ``tenant_id`` (the percentiles' key; dropped
    by :func:`with_percentiles`); ``scoped``: the period's records, which the percentiles read."""

    rows: list[dict[str, Any]]
    scoped: QuerySet[UsageRecord]


def traffic_totals(records: QuerySet[UsageRecord], *, since: datetime, until: datetime, bucket: str = "minute",
                   hours: QuerySet[UsageHour] | None = None) -> TrafficTotals:
    """Counts, tokens and sparkline per (tenant, model, version) of ``records`` in ``[since, until)``: one grouped
    read per part (the records; with ``hours`` and hourly buckets, the whole final hours' sums), no percentiles.

    Args and errors as :func:`traffic_table`. Returns a :class:`TrafficTotals` whose rows are ``{"tenant_id",
    "tenant", "model", "version", "requests", "requests_per_s", "prompt_tokens", "completion_tokens",
    "tokens_per_s", "failures", "spark"}``, sorted as :func:`order_rows` sorts by default.
    """
    trunc, width = BUCKETS[bucket]
    first = _bucket_start(since, width)
    n_buckets = max(1, math.ceil((until - first) / width))
    if n_buckets > MAX_BUCKETS:
        raise ValueError(f"{n_buckets} {bucket} buckets; at most {MAX_BUCKETS}: use a wider bucket")
    scoped = records.filter(created_at__gte=since, created_at__lt=until)
    seconds = max(1.0, (until - since).total_seconds())
    counted = [(scoped, Count("id"), Count("id", filter=Q(status_code__gte=400)))]
    if hours is not None and bucket == "hour":
        part = split(records, hours, since=since, until=until)
        counted = [(part.records, Count("id"), Count("id", filter=Q(status_code__gte=400))),
                   (part.hours.annotate(created_at=F("hour")), Sum("requests"), Sum("errors"))]  # type: ignore[list-item]
    # One grouped read per part gives the counts, tokens and sparkline together: (version, bucket) rows summed per
    # version here (a separate per-version read cost a query and a pass over every version).
    postgres = connection.vendor == "postgresql"
    grouped = [_named(qs.annotate(b=BucketIndex(F("created_at"), first, width) if postgres else trunc("created_at")))
               .values(*GROUP, "b").annotate(requests=requests, failures=failures, prompt=Sum("prompt_tokens"),
                                             completion=Sum("completion_tokens"))
               for qs, requests, failures in counted]
    spark: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0] * n_buckets)
    if postgres:
        cells = [r for qs in grouped for r in _per_version(qs)]
        for r in cells:
            line = spark[tuple(r[g] for g in GROUP)]
            for i, n in zip(r["buckets"], r["counts"], strict=True):
                if 0 <= i < n_buckets:
                    line[i] += n
    else:
        cells = [r for qs in grouped for r in qs]
        for r in cells:
            i = int((r["b"] - first) / width)
            if 0 <= i < n_buckets:
                spark[tuple(r[g] for g in GROUP)][i] += r["requests"]
    rows = []
    for r in add_up(cells, GROUP, ("requests", "failures", "prompt", "completion")).values():
        prompt, completion = r["prompt"] or 0, r["completion"] or 0
        rows.append({
            "tenant_id": r["tenant_id"], "tenant": r["tenant__slug"], "model": r["adapter"],
            "version": r["version_number"], "requests": r["requests"],
            "requests_per_s": _rate(r["requests"], seconds), "prompt_tokens": prompt,
            "completion_tokens": completion, "tokens_per_s": _rate(prompt + completion, seconds),
            "failures": r["failures"], "spark": spark[tuple(r[g] for g in GROUP)],
        })
    return TrafficTotals(order_rows(rows), scoped)


def _rate(count: int, seconds: float) -> float:
    """``count`` per second over ``seconds``, to 4 significant digits: rounding to decimal places wrote a real but
    low rate (a token an hour: 0.00028/s) as 0.0, and the console then showed "0.0" tokens/s (issue 30)."""
    return float(f"{count / seconds:.4g}")


def order_rows(rows: list[dict[str, Any]], ordering: str = "-requests") -> list[dict[str, Any]]:
    """``rows`` (of :func:`traffic_totals`) sorted by ``ordering``: one of :data:`ORDERINGS`, ``-`` for
    descending, then always by tenant, model and version ascending (base model first), so the order is total and a
    page boundary never falls between two rows that could swap. Raises KeyError for an unknown ordering."""
    field = ordering.removeprefix("-")
    primary = ORDERINGS[field]
    ordered = sorted(rows, key=lambda r: (r["tenant"], r["model"], r["version"] or 0))
    # Python's sort is stable, reversed too: the tie-break above survives the primary sort in either direction.
    ordered.sort(key=primary, reverse=ordering.startswith("-"))
    return ordered


def _only(keys: list[tuple[Any, ...]]) -> Q:
    """Records of these (tenant id, model, version) keys. Each branch compares the tenant id first: PostgreSQL
    evaluates an AND's terms in order, so most records fail on an integer before the model's ``CASE`` is computed."""
    match = Q()
    for tenant_id, adapter, version in keys:
        same_version = Q(version_number__isnull=True) if version is None else Q(version_number=version)
        match |= Q(tenant_id=tenant_id) & same_version & Q(adapter=adapter)
    return Q(tenant_id__in=sorted({k[0] for k in keys})) & match


def with_percentiles(rows: list[dict[str, Any]], scoped: QuerySet[UsageRecord], *,
                     every: bool = False) -> list[dict[str, Any]]:
    """``rows`` of a :class:`TrafficTotals` (all of them or a page; their order kept) with their latency and TTFT
    percentiles (ms, rounded to 0.1; null without data), ``tenant_id`` dropped: the rows of :func:`traffic_table`.

    Percentiles are over the period's latest :data:`PERCENTILE_ROWS` records of ``scoped`` (all of them below
    that), whatever the rows asked for: a version's figures are the same on a page as in the whole table. Only the
    given rows' records are sorted (``every``: the rows are all of ``scoped``'s versions, so no filter is needed).
    Two queries (the cut, the percentiles); none for no rows.
    """
    keys = [(r["tenant_id"], r["model"], r["version"]) for r in rows]
    pcts: dict[tuple[Any, ...], dict[str, float | None]] = {}
    if keys:
        # The cut is over every version's records, then narrowed: the same records as the unpaged table's.
        sample = _named(latest(scoped))
        if not every:
            sample = sample.filter(_only(keys))
        if connection.vendor == "postgresql":
            for r in sample.values(*PCT_GROUP).annotate(
                    **{k: Percentile(F(col), p) for k, (col, p) in WANTED.items()}).order_by():
                pcts[tuple(r[g] for g in PCT_GROUP)] = {k: r[k] for k in WANTED}
        else:
            samples: dict[tuple[Any, ...], dict[str, list[float]]] = defaultdict(
                lambda: {"latency_ms": [], "ttft_ms": []})
            for *key, latency, ttft in sample.values_list(*PCT_GROUP, "latency_ms", "ttft_ms"):
                samples[tuple(key)]["latency_ms"].append(latency)
                if ttft is not None:
                    samples[tuple(key)]["ttft_ms"].append(ttft)
            pcts = {key: {k: percentile(s[col], p) for k, (col, p) in WANTED.items()} for key, s in samples.items()}
    out = []
    for key, r in zip(keys, rows, strict=True):
        figures = pcts.get(key, dict.fromkeys(WANTED))
        row = {k: v for k, v in r.items() if k not in ("tenant_id", "spark")}
        out.append({**row, **{k: None if v is None else round(v, 1) for k, v in figures.items()}, "spark": r["spark"]})
    return out


def traffic_table(records: QuerySet[UsageRecord], *, since: datetime, until: datetime,
                  bucket: str = "minute", hours: QuerySet[UsageHour] | None = None) -> list[dict[str, Any]]:
    """Traffic per (tenant, model, version) over an already scoped ``records`` queryset in ``[since, until)``.

    Given ``hours`` (scoped as ``records``) and hourly buckets, the counts, tokens and sparkline of the whole final
    hours come from those sums (``inference.metering.hours``). Percentiles are over the period's latest
    :data:`PERCENTILE_ROWS` records (all of them below that; a version without a record among them has null
    percentiles). A paged table uses :func:`traffic_totals`, :func:`order_rows` and :func:`with_percentiles`.

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
    totals = traffic_totals(records, since=since, until=until, bucket=bucket, hours=hours)
    return with_percentiles(totals.rows, totals.scoped, every=True)
