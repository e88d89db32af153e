"""The traffic table's counts, tokens and sparklines, now one grouped read per part with the bucket computed in
PostgreSQL and the (version, bucket) cells summed there per version, equal a count of the records in Python: every
record in its bucket (edges included: on a minute, on ``since``, just before ``until``), every version once, whether
called by name or pinned, from the records alone and with the hourly sums (docs/scale-usage.md, "Operator pages at 64
nodes")."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.metering.models import UsageHour, UsageRecord
from inference.metering.traffic import traffic_table

pytestmark = pytest.mark.django_db


def _expected(records: list[UsageRecord], *, since: datetime, until: datetime, width: timedelta) -> dict[Any, Any]:
    first = since.replace(second=0, microsecond=0) if width < timedelta(hours=1) else since.replace(
        minute=0, second=0, microsecond=0)
    n = max(1, math.ceil((until - first) / width))
    out: dict[Any, dict[str, Any]] = defaultdict(lambda: {"requests": 0, "failures": 0, "prompt_tokens": 0,
                                                         "completion_tokens": 0, "spark": [0] * n})
    for r in records:
        if not since <= r.created_at < until:
            continue
        row = out[(r.tenant.slug, r.model_name.split("@")[0], r.version_number)]
        row["requests"] += 1
        row["failures"] += r.status_code >= 400
        row["prompt_tokens"] += r.prompt_tokens
        row["completion_tokens"] += r.completion_tokens
        row["spark"][int((r.created_at - first) / width)] += 1
    return dict(out)


def _got(rows: list[dict[str, Any]]) -> dict[Any, Any]:
    keep = ("requests", "failures", "prompt_tokens", "completion_tokens", "spark")
    return {(r["tenant"], r["model"], r["version"]): {k: r[k] for k in keep} for r in rows}


def test_counts_and_sparklines_equal_the_records_counted_in_python(make_client: Any, base_model: Any) -> None:
    rng = random.Random(5)
    now = timezone.now().replace(second=30, microsecond=0)
    tenants = [make_client()[1] for _ in range(3)]
    made = []
    for t in tenants:
        for name in ("bot", "qa"):
            adapter = adapter_create(t, name=name, base_model_name="tiny-llama")
            for number in (1, 2):
                made.append(AdapterVersion.objects.create(
                    tenant=t, adapter=adapter, number=number, sha256=f"{t.pk}{name}{number}".ljust(64, "0"),
                    size_bytes=1, s3_prefix="x/", files=[], status="ready"))
    since = now - timedelta(hours=2, seconds=17.5)  # not on a minute: the first bucket is partial
    edges = [since, since - timedelta(microseconds=1), now - timedelta(microseconds=1), now,
             now.replace(second=0) - timedelta(minutes=31), now.replace(minute=0, second=0)]
    rows = []
    for i in range(1500):
        at = edges[i] if i < len(edges) else now - timedelta(seconds=rng.uniform(0, 3 * 3600))
        version = rng.choice([*made, None])
        tenant = version.tenant if version else rng.choice(tenants)
        name = "tiny-llama" if version is None else version.adapter.name + (f"@{version.number}" if i % 3 else "")
        rows.append(UsageRecord(tenant=tenant, adapter_version=version, model_name=name,
                                version_number=version.number if version else None, endpoint="completions",
                                status_code=rng.choice([200, 200, 200, 429, 503]), prompt_tokens=rng.randint(1, 50),
                                completion_tokens=rng.randint(0, 9), latency_ms=rng.uniform(5, 500), created_at=at))
    UsageRecord.objects.bulk_create(rows)
    records = list(UsageRecord.objects.select_related("tenant"))
    for bucket, width in (("minute", timedelta(minutes=1)), ("hour", timedelta(hours=1))):
        with CaptureQueriesContext(connection) as queries:
            got = _got(traffic_table(UsageRecord.objects.all(), since=since, until=now, bucket=bucket))
        assert got == _expected(records, since=since, until=now, width=width), bucket
        assert len(got) == 3 * (2 * 2 + 1)  # every version once (by name or pinned), plus each base model row
        assert len(queries.captured_queries) == 3  # the cells, the percentile cut, the percentiles


def test_with_hourly_sums_the_table_equals_the_records_alone(make_client: Any, base_model: Any) -> None:
    _, tenant, _ = make_client()
    call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "3000", "--days", "2", "--seed", "9")
    until = timezone.now()
    since = (until - timedelta(hours=30, minutes=11)).astimezone(UTC)
    records = UsageRecord.objects.filter(tenant=tenant)
    hours = UsageHour.objects.filter(tenant=tenant)
    assert hours.exists()
    from_hours = traffic_table(records, since=since, until=until, bucket="hour", hours=hours)
    raw = traffic_table(records, since=since, until=until, bucket="hour")
    assert _got(from_hours) == _got(raw) == _expected(list(records.select_related("tenant")), since=since,
                                                      until=until, width=timedelta(hours=1))
