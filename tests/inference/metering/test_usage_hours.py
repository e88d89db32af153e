"""Usage totals, hourly series, traffic and per-version figures read from the hourly sums (``UsageHour``) for the
whole final hours and from the raw records for the rest give the same figures as from the raw records alone; their
percentiles read a period's latest records only (docs/scale-usage.md, "Usage at a year of traffic")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from adapters_app.models import Adapter
from inference.metering.hours import split
from inference.metering.models import UsageHour, UsageRecord
from inference.metering.selectors import usage_summary
from inference.metering.series import usage_series
from inference.metering.traffic import latest, traffic_table
from inference.metering.versions import version_figures

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(make_client, base_model):  # type: ignore[no-untyped-def]
    """Two tenants' 3 days of records up to now, with their rollups and hourly sums."""
    _, tenant, _ = make_client()
    _, other, _ = make_client()
    for t, rows in ((tenant, 4000), (other, 500)):
        call_command("quiver_seed_usage", "--tenant", t.slug, "--rows", str(rows), "--days", "3", "--seed", "3")
    return tenant


def _scoped(tenant):  # type: ignore[no-untyped-def]
    return UsageRecord.objects.filter(tenant=tenant), UsageHour.objects.filter(tenant=tenant)


def test_summary_from_hours_equals_summary_from_records(seeded) -> None:  # type: ignore[no-untyped-def]
    records, hours = _scoped(seeded)
    now = timezone.now()
    periods = [(None, None), (now - timedelta(days=1, minutes=17), None), (now - timedelta(hours=2), None),
               (now - timedelta(days=2, seconds=5), now - timedelta(hours=5, minutes=-13)),
               (now - timedelta(minutes=30), now - timedelta(minutes=10))]
    for since, until in periods:
        expected = usage_summary(records, since=since, until=until)
        assert expected and usage_summary(records, since=since, until=until, hours=hours) == expected, (since, until)
    assert sum(r["requests"] for r in usage_summary(records, hours=hours)) == 4000


def test_split_reads_only_the_edges_raw(seeded) -> None:  # type: ignore[no-untyped-def]
    records, hours = _scoped(seeded)
    part = split(records, hours, since=None, until=None)
    assert part.hours.count() > 50 and part.records.count() < records.count() / 10  # the last ~hour and lookback


def test_hourly_series_from_hours_equals_series_from_records(seeded) -> None:  # type: ignore[no-untyped-def]
    records, hours = _scoped(seeded)
    for since in (timezone.now() - timedelta(days=2, minutes=7), timezone.now() - timedelta(minutes=40)):
        expected = usage_series(records, since=since, bucket="hour")
        got = usage_series(records, since=since, bucket="hour", hours=hours)
        assert [{**r, "latency_ms_avg": 0} for r in got] == [{**r, "latency_ms_avg": 0} for r in expected]
        # A mean from sums differs from AVG() by float rounding only.
        assert [r["latency_ms_avg"] for r in got] == pytest.approx([r["latency_ms_avg"] for r in expected], abs=0.11)
    assert usage_series(records, since=since, bucket="minute", hours=hours) == usage_series(records, since=since)


def test_traffic_and_versions_from_hours_equal_those_from_records(seeded) -> None:  # type: ignore[no-untyped-def]
    records, hours = _scoped(seeded)
    now = timezone.now()
    since, until = now - timedelta(days=2, minutes=21), now
    expected = traffic_table(records, since=since, until=until, bucket="hour")
    assert expected and traffic_table(records, since=since, until=until, bucket="hour", hours=hours) == expected
    adapter = Adapter.objects.get(tenant=seeded, name="seed-0")
    expected = version_figures(records, adapter=adapter, since=since, until=until)
    assert [r["version"] for r in expected] == [1, 2]
    assert version_figures(records, adapter=adapter, since=since, until=until, hours=hours) == expected


def test_percentiles_read_only_the_latest_records(seeded) -> None:  # type: ignore[no-untyped-def]
    records, _ = _scoped(seeded)
    newest = list(records.order_by("-created_at").values_list("created_at", flat=True)[:100])
    assert set(latest(records, 100).values_list("created_at", flat=True)) == set(newest)
    assert latest(records, 10_000).count() == records.count()  # fewer records than the bound: all of them


def test_operator_traffic_from_hours_equals_traffic_from_records(seeded) -> None:  # type: ignore[no-untyped-def]
    """The operator's table over every tenant (and filtered to one) reads whole final hours from the sums when its
    sparkline is hourly: the same rows, to the JSON, as every record of the period read raw."""
    op = APIClient()
    op.force_login(User.objects.create_user(username="ops-hours", password="x", is_staff=True))
    until = timezone.now().replace(microsecond=0) + timedelta(seconds=1)
    since = until - timedelta(days=2, minutes=21)
    query = {"since": since.isoformat(), "until": until.isoformat()}
    expected = traffic_table(UsageRecord.objects.all(), since=since, until=until, bucket="hour")
    assert {r["tenant"] for r in expected} == {seeded.slug, UsageRecord.objects.exclude(tenant=seeded)[0].tenant.slug}
    with CaptureQueriesContext(connection) as read:
        assert op.get("/api/v1/operator/traffic", query).json()["results"] == expected
    assert any("metering_usagehour" in q["sql"] for q in read.captured_queries)  # not a day of every record
    mine = traffic_table(UsageRecord.objects.filter(tenant=seeded), since=since, until=until, bucket="hour")
    assert op.get("/api/v1/operator/traffic", {**query, "tenant": seeded.slug}).json()["results"] == mine
