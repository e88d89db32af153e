"""Per-minute usage rollups (requests, errors, tokens, latency and TTFT percentiles per tenant and adapter version),
their API with a time range, and the retention of raw records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.metering import rollups
from inference.metering.models import UsageRecord, UsageRollup
from inference.metering.rollups import percentile, usage_retention_purge, usage_rollup
from inference.metering.tasks import usage_retention_task, usage_rollup_task

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 1, 12, 30, 40, tzinfo=UTC)


def _version(tenant, name: str, number: int = 1) -> AdapterVersion:  # type: ignore[no-untyped-def]
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    return AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=number, sha256=name * 4,
                                         size_bytes=1, s3_prefix="x/", files=[], status="ready")


def _record(tenant, at: datetime, *, version: AdapterVersion | None = None, status: int = 200,  # type: ignore[no-untyped-def]
            latency: float = 10.0, ttft: float | None = None, prompt: int = 3, completion: int = 5) -> UsageRecord:
    return UsageRecord.objects.create(
        tenant=tenant, adapter_version=version, model_name=version.adapter.name if version else "tiny-llama",
        version_number=version.number if version else None, endpoint="completions", stream=ttft is not None,
        status_code=status, prompt_tokens=prompt, completion_tokens=completion, latency_ms=latency, ttft_ms=ttft,
        created_at=at)


def test_percentile_interpolates_as_postgres_percentile_cont() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.95) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(i) for i in range(1, 101)], 0.95) == pytest.approx(95.05)


def test_rollup_per_minute_tenant_and_version(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    _, other, _ = make_client()
    bot = _version(tenant, "bot")
    minute = NOW.replace(second=0, microsecond=0) - timedelta(minutes=2)
    for i in range(1, 21):  # latencies 1..20 ms, TTFT 0.5..10 ms, one 502 and one 499
        status = 502 if i == 7 else 499 if i == 8 else 200
        _record(tenant, minute + timedelta(seconds=i), version=bot, status=status, latency=float(i), ttft=i / 2)
    _record(tenant, minute + timedelta(seconds=30), latency=40.0)  # the base model, not streamed
    _record(tenant, minute + timedelta(minutes=1, seconds=5), version=bot, latency=3.0, ttft=1.0)
    _record(other, minute + timedelta(seconds=5), latency=99.0, completion=100)

    assert usage_rollup(now=NOW) == 4
    rows = {(r.tenant_id, r.minute, r.model_name, r.version_number): r for r in UsageRollup.objects.all()}
    first = rows[(tenant.pk, minute, "bot", 1)]
    assert (first.requests, first.errors, first.prompt_tokens, first.completion_tokens) == (20, 2, 60, 100)
    assert first.adapter_version_id == bot.pk
    assert first.latency_p50_ms == pytest.approx(10.5) and first.latency_p95_ms == pytest.approx(19.05)
    assert first.ttft_p50_ms == pytest.approx(5.25) and first.ttft_p95_ms == pytest.approx(9.525)
    base = rows[(tenant.pk, minute, "tiny-llama", None)]
    assert (base.requests, base.latency_p50_ms, base.ttft_p50_ms, base.adapter_version_id) == (1, 40.0, None, None)
    assert rows[(tenant.pk, minute + timedelta(minutes=1), "bot", 1)].requests == 1
    assert rows[(other.pk, minute, "tiny-llama", None)].completion_tokens == 100


def test_rerun_replaces_the_window_and_counts_late_records(make_client) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    minute = NOW.replace(second=0, microsecond=0) - timedelta(minutes=5)
    _record(tenant, minute + timedelta(seconds=1))
    usage_rollup(now=NOW)
    usage_rollup(now=NOW)  # a second run (or an overlapping beat tick) does not double anything
    assert list(UsageRollup.objects.values_list("requests", flat=True)) == [1]
    _record(tenant, minute + timedelta(seconds=2), status=502)  # a long stream, written when it ended
    usage_rollup(now=NOW)
    assert list(UsageRollup.objects.values_list("requests", "errors")) == [(2, 1)]
    with override_settings(QUIVER_USAGE_ROLLUP_LOOKBACK_S=60):  # older minutes are final and left alone
        _record(tenant, minute + timedelta(seconds=3))
        usage_rollup(now=NOW)
    assert list(UsageRollup.objects.values_list("requests", flat=True)) == [2]


def test_rollups_api_reads_a_time_range_scoped_to_the_tenant(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    _, other, _ = make_client()
    bot = _version(tenant, "bot")
    base = datetime.now(UTC).replace(second=0, microsecond=0)
    for minutes_ago in (90, 30, 2):
        _record(tenant, base - timedelta(minutes=minutes_ago, seconds=-1), version=bot, ttft=2.0)
    _record(other, base - timedelta(minutes=2, seconds=-1), completion=1000)
    with override_settings(QUIVER_USAGE_ROLLUP_LOOKBACK_S=7200):
        usage_rollup_task.apply()

    rows = client.get("/api/v1/usage/rollups").json()  # the last hour by default
    assert [datetime.fromisoformat(r["minute"]) for r in rows] == [base - timedelta(minutes=m) for m in (30, 2)]
    assert {r["completion_tokens"] for r in rows} == {5}
    assert rows[0] | {"minute": None} == {
        "minute": None, "model": "bot", "version": 1, "requests": 1, "failures": 0, "prompt_tokens": 3,
        "completion_tokens": 5, "latency_p50_ms": 10.0, "latency_p95_ms": 10.0, "ttft_p50_ms": 2.0,
        "ttft_p95_ms": 2.0}
    since = (base - timedelta(hours=2)).isoformat()
    until = (base - timedelta(minutes=10)).isoformat()
    ranged = client.get("/api/v1/usage/rollups", {"since": since, "until": until}).json()
    assert [datetime.fromisoformat(r["minute"]) for r in ranged] == [base - timedelta(minutes=m) for m in (90, 30)]
    assert client.get("/api/v1/usage/rollups", {"since": since, "model": "tiny-llama"}).json() == []
    bad = client.get("/api/v1/usage/rollups", {"since": until, "until": since})
    assert bad.status_code == 400 and "until" in bad.json()["fields"]
    assert client.get("/api/v1/usage/rollups", {"since": "soon"}).status_code == 400


def test_retention_deletes_old_raw_records_and_keeps_rollups(make_client) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    old = _record(tenant, NOW - timedelta(days=31))
    young = _record(tenant, NOW - timedelta(days=29))
    UsageRollup.objects.create(tenant=tenant, minute=old.created_at.replace(second=0, microsecond=0),
                               model_name="tiny-llama", requests=1, errors=0, prompt_tokens=3, completion_tokens=5,
                               latency_p50_ms=10.0, latency_p95_ms=10.0)
    with override_settings(QUIVER_USAGE_RETENTION_DAYS=30):
        assert usage_retention_purge(now=NOW) == 1
    assert list(UsageRecord.objects.values_list("pk", flat=True)) == [young.pk]
    assert UsageRollup.objects.count() == 1
    with override_settings(QUIVER_USAGE_RETENTION_DAYS=0):  # 0 keeps raw records forever
        usage_retention_task.apply()
        assert usage_retention_purge(now=NOW + timedelta(days=400)) == 0
    assert UsageRecord.objects.count() == 1
    with override_settings(QUIVER_USAGE_RETENTION_DAYS=1, QUIVER_USAGE_ROLLUP_LOOKBACK_S=2 * 86400), \
            pytest.raises(ValueError, match="QUIVER_USAGE_RETENTION_DAYS"):
        usage_retention_purge(now=NOW)


def test_retention_deletes_in_batches_the_database_picks(make_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No batch's ids travel to Python and back: fetching and re-sending 5,000 ids a batch cost 76 s of CPU on 7.5
    million rows, holding the GIL of the worker that also runs the warms."""
    _, tenant, _ = make_client()
    for days in (40, 41, 42, 43, 44):
        _record(tenant, NOW - timedelta(days=days))
    young = _record(tenant, NOW - timedelta(days=1))
    monkeypatch.setattr(rollups, "DELETE_BATCH", 2)
    with override_settings(QUIVER_USAGE_RETENTION_DAYS=30), CaptureQueriesContext(connection) as ctx:
        assert usage_retention_purge(now=NOW) == 5
    assert list(UsageRecord.objects.values_list("pk", flat=True)) == [young.pk]
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 4  # 2 + 2 + 1, then one that finds nothing
    assert not [q for q in ctx.captured_queries if q["sql"].startswith("SELECT")]
