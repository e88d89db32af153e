"""The CSV export formatted by PostgreSQL (``usage_csv``) is byte for byte what ``csv.writer`` wrote row by row
(``usage_csv_python``): seeded records, and hand-made ones at every edge of the formats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from inference.metering.models import UsageRecord
from inference.metering.selectors import usage_csv, usage_csv_python

pytestmark = pytest.mark.django_db


def _edges(tenant) -> None:  # type: ignore[no-untyped-def]
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    odd = [  # (model_name, version, endpoint, stream, status, latency, ttft, created_at)
        ("base", None, "completions", False, 200, 100.0, None, at),  # whole second, integer-valued float
        ('we,ird "name"', 3, "chat/completions", True, 499, 0.0001, 1e-7, at + timedelta(microseconds=1)),
        ("line\nbreak\rname", 1, "completions", True, 502, 1e15, 1e16, at + timedelta(seconds=1, microseconds=500000)),
        ("", None, "completions", False, 429, 2.5, 0.0, at + timedelta(seconds=2)),
        ("bot@2", 2, "completions", True, 200, 123456789.125, 80.5, at + timedelta(days=300, microseconds=999999)),
    ]
    UsageRecord.objects.bulk_create(UsageRecord(
        tenant=tenant, model_name=m, version_number=v, endpoint=e, stream=s, status_code=c, prompt_tokens=i * 7,
        completion_tokens=i, latency_ms=lat, ttft_ms=tt, created_at=when, request_id=f"edge-{i}")
        for i, (m, v, e, s, c, lat, tt, when) in enumerate(odd))


def test_the_server_formatted_export_is_the_python_one_byte_for_byte(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "3000", "--days", "2", "--seed", "5")
    _edges(tenant)
    records = UsageRecord.objects.filter(tenant=tenant)
    now = datetime.now(UTC)
    for since, until in ((None, None), (now - timedelta(hours=7), None), (now - timedelta(days=1), now - timedelta(hours=3))):
        expected = "".join(usage_csv_python(records, since=since, until=until))
        got = "".join(usage_csv(records, since=since, until=until))
        assert got == expected, (since, until)
    whole = "".join(usage_csv(records, since=None, until=None))
    assert whole.count("\r\n") == 3000 + 5 + 1  # records, edges, header (the quoted name holds a lone LF and CR)
    assert '"we,ird ""name"""' in whole and ",100.0,\r\n" in whole and "2026-03-01T12:00:00+00:00" in whole
