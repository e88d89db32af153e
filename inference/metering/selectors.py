"""Reads for metering, scoped by tenant."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, QuerySet, Sum
from django.db.models.expressions import RawSQL

from inference.metering.hours import add_up, split
from inference.metering.models import UsageHour, UsageRecord


def usage_summary(records: QuerySet[UsageRecord], *, since: datetime | None = None,
                  until: datetime | None = None, hours: QuerySet[UsageHour] | None = None) -> list[dict[str, Any]]:
    """Token totals per (model, version) over an already tenant-scoped ``records`` queryset.

    Names are those recorded at request time, so usage of a since-deleted adapter still counts under its name.
    Given ``hours`` (scoped as ``records``), the period's whole final hours are summed from them and only the rest
    from the records (``inference.metering.hours``): the same totals, without reading a year of records.

    Returns:
        ``[{"model", "adapter", "version", "requests", "prompt_tokens", "completion_tokens"}]``; ``adapter`` and
        ``version`` are None for base-model requests, ``model`` is what the application sent (``name@N`` too: its
        ``adapter`` is ``name``). Sorted by model, version.
    """
    rows: list[dict[str, Any]]
    if hours is not None:
        rows = _summary_split(records, hours, since=since, until=until)
    else:
        if since is not None:
            records = records.filter(created_at__gte=since)
        if until is not None:
            records = records.filter(created_at__lt=until)
        rows = [dict(r) for r in records.values("model_name", "version_number").annotate(
            requests=Count("id"), prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
        ).order_by("model_name", "version_number")]
    return [
        {
            "model": r["model_name"],
            # The adapter's name even for a ``name@N`` request (it read "support-bot@2"; a fresh user's finding).
            "adapter": r["model_name"].partition("@")[0] if r["version_number"] is not None else None,
            "version": r["version_number"],
            "requests": r["requests"],
            "prompt_tokens": r["prompt_tokens"] or 0,
            "completion_tokens": r["completion_tokens"] or 0,
        }
        for r in rows
    ]


def _summary_split(records: QuerySet[UsageRecord], hours: QuerySet[UsageHour], *, since: datetime | None,
                   until: datetime | None) -> list[dict[str, Any]]:
    part = split(records, hours, since=since, until=until)
    sums = add_up((r for qs, count in ((part.records, Count("id")), (part.hours, Sum("requests")))
                   for r in qs.values("model_name", "version_number").annotate(
                       requests=count, prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"))),
                  ("model_name", "version_number"), ("requests", "prompt_tokens", "completion_tokens"))
    # As ORDER BY model_name, version_number: the base model's null version last.
    return [sums[k] for k in sorted(sums, key=lambda k: (k[0], k[1] is None, k[1] or 0))]


CSV_FIELDS = ("created_at", "model", "version", "endpoint", "stream", "status_code", "prompt_tokens",
              "completion_tokens", "latency_ms", "ttft_ms")
_TABLE = UsageRecord._meta.db_table


def _csv_text(column: str) -> str:
    """A text column as ``csv.writer`` writes it (QUOTE_MINIMAL: quoted when it holds ``,``, ``"``, CR or LF)."""
    col = f'"{_TABLE}"."{column}"'
    return rf"""CASE WHEN {col} ~ '[",\r\n]' THEN '"' || replace({col}, '"', '""') || '"' ELSE {col} END"""


# The record's first eight CSV fields as one text, formatted in PostgreSQL exactly as ``usage_csv_python`` formats
# them (``datetime.isoformat()`` in UTC, with microseconds only when there are some; ``None`` as nothing; ``True``/
# ``False``): the export's cost was Python building a datetime and a tuple per row and formatting them (~47,000 rows
# a second). The two floats stay Python's ``repr``: PostgreSQL's float text differs (``100`` for ``100.0``, ``1e+15``).
CSV_HEAD_SQL = " || ',' || ".join([
    f"""to_char("{_TABLE}"."created_at" AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')"""
    f""" || CASE WHEN date_trunc('second', "{_TABLE}"."created_at") = "{_TABLE}"."created_at" THEN ''"""
    f""" ELSE to_char("{_TABLE}"."created_at" AT TIME ZONE 'UTC', '.US') END || '+00:00'""",
    _csv_text("model_name"),
    f"""coalesce("{_TABLE}"."version_number"::text, '')""",
    _csv_text("endpoint"),
    f"""CASE WHEN "{_TABLE}"."stream" THEN 'True' ELSE 'False' END""",
    *(f"""coalesce("{_TABLE}"."{c}"::text, '')""" for c in ("status_code", "prompt_tokens", "completion_tokens")),
])


def usage_csv(records: QuerySet[UsageRecord], *, since: datetime | None, until: datetime | None) -> Iterator[str]:
    """Raw usage records of an already tenant-scoped queryset in ``[since, until)`` as CSV lines (header first,
    ``\\r\\n`` line ends as ``csv.writer``), oldest first; ``status_code`` 499 = client went away, 502 = the engine's
    stream was cut. Read through a server-side cursor (``iterator``), so memory stays flat whatever the range.

    On PostgreSQL each line but its two floats is formatted by the server (:data:`CSV_HEAD_SQL`); the bytes are
    those of :func:`usage_csv_python`, which SQLite (the embedded demo) still runs.
    """
    if connection.vendor != "postgresql":
        yield from usage_csv_python(records, since=since, until=until)
        return
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    yield ",".join(CSV_FIELDS) + "\r\n"
    rows = records.order_by("created_at", "pk").annotate(csv_head=RawSQL(CSV_HEAD_SQL, ())).values_list(
        "csv_head", "latency_ms", "ttft_ms")
    for head, latency, ttft in rows.iterator(chunk_size=2000):
        yield f"{head},{latency!r},{'' if ttft is None else repr(ttft)}\r\n"


def usage_csv_python(records: QuerySet[UsageRecord], *, since: datetime | None,
                     until: datetime | None) -> Iterator[str]:
    """:func:`usage_csv` formatted in Python, row by row (any database; the reference for the PostgreSQL path)."""
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
