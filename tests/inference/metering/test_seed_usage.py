"""``manage.py quiver_seed_usage``: synthetic usage records and their rollups for one tenant (scripts/bench_usage)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Count, Max, Min, Q, Sum
from django.test import override_settings

from inference.metering.models import UsageHour, UsageRecord, UsageRollup
from inference.metering.rollups import usage_rollup

pytestmark = pytest.mark.django_db
UNTIL = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _seed(slug: str, rows: int, seed: int = 1) -> None:
    call_command("quiver_seed_usage", "--tenant", slug, "--rows", str(rows), "--days", "14", "--until",
                 UNTIL.isoformat(), "--seed", str(seed))


def _rollup_figures() -> dict[tuple[object, ...], tuple[object, ...]]:
    return {(r.tenant_id, r.minute, r.model_name, r.version_number):
            (r.adapter_version_id, r.requests, r.errors, r.prompt_tokens, r.completion_tokens,
             round(r.latency_p50_ms, 6), round(r.latency_p95_ms, 6), r.ttft_p50_ms and round(r.ttft_p50_ms, 6),
             r.ttft_p95_ms and round(r.ttft_p95_ms, 6))
            for r in UsageRollup.objects.all()}


def _hour_figures() -> dict[tuple[object, ...], tuple[object, ...]]:
    return {(h.tenant_id, h.hour, h.model_name, h.version_number):
            (h.adapter_version_id, h.requests, h.errors, h.prompt_tokens, h.completion_tokens, round(h.latency_sum_ms, 3))
            for h in UsageHour.objects.all()}


def test_refuses_without_rows_or_an_existing_tenant(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    with pytest.raises(CommandError, match="--rows"):
        call_command("quiver_seed_usage", "--tenant", tenant.slug)
    with pytest.raises(CommandError, match="No tenant"):
        call_command("quiver_seed_usage", "--tenant", "nobody-here", "--rows", "10")
    with pytest.raises(CommandError, match="--rows"):
        call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "0")
    with pytest.raises(CommandError, match="--days"):
        call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "10", "--days", "0")
    with pytest.raises(CommandError, match="--adapters"):
        call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "10", "--adapters", "0")
    assert not UsageRecord.objects.exists()


def test_prints_its_rate(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    err = StringIO()
    call_command("quiver_seed_usage", "--tenant", tenant.slug, "--rows", "500", "--days", "2", stderr=err)
    assert UsageRecord.objects.filter(tenant=tenant).count() == 500
    assert re.search(r"seeded 500 usage records .*\([\d,]+ rows/s copied, [\d,]+ rows/s with the rollups", err.getvalue())


def test_seeds_the_tenant_over_the_period_with_its_shape(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    _, other, _ = make_client()
    _seed(tenant.slug, 5000)
    records = UsageRecord.objects.all()
    assert records.count() == 5000 and set(records.values_list("tenant_id", flat=True)) == {tenant.pk}
    span = records.aggregate(first=Min("created_at"), last=Max("created_at"))
    assert UNTIL - timedelta(days=14) <= span["first"] < UNTIL - timedelta(days=13)
    assert UNTIL - timedelta(days=1) < span["last"] < UNTIL
    per_day = {d: n for d, n in records.values_list("created_at__date").annotate(n=Count("id"))}
    assert len(per_day) >= 14
    weekday = [n for d, n in per_day.items() if d.weekday() < 5 and UNTIL.date() - timedelta(days=13) < d < UNTIL.date()]
    weekend = [n for d, n in per_day.items() if d.weekday() >= 5]
    assert sum(weekend) / len(weekend) < 0.75 * sum(weekday) / len(weekday)  # weekends carry about half
    afternoon = records.filter(created_at__hour__range=(11, 17)).count()
    night = records.filter(created_at__hour__in=(0, 1, 2, 3, 4, 5, 23)).count()
    assert afternoon > 2 * night  # the daily curve peaks at 14:00 UTC
    assert records.values("request_id").distinct().count() == 5000
    models = set(records.values_list("model_name", "version_number"))
    assert {("seed-0", 1), ("seed-0", 2), ("seed-1", 2), ("tiny-llama", None)} <= models
    assert set(records.values_list("api_key_id", flat=True)) == set(tenant.api_keys.values_list("pk", flat=True))
    statuses = dict(records.values_list("status_code").annotate(n=Count("id")))
    assert set(statuses) == {200, 400, 429, 499, 502} and 0.9 < statuses[200] / 5000 < 0.99
    assert not records.filter(stream=False, ttft_ms__isnull=False).exists()
    assert records.filter(stream=True, status_code=200, ttft_ms__isnull=True).count() == 0
    assert 0.5 < records.filter(stream=True).count() / 5000 < 0.7
    assert not UsageRecord.objects.filter(tenant=other).exists()


def test_rollups_match_the_records_and_the_beat_task(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    _seed(tenant.slug, 3000)
    _seed(tenant.slug, 2000, seed=2)  # a second run adds: fresh request ids, rollups recomputed over both runs
    records = UsageRecord.objects.filter(tenant=tenant)
    assert records.count() == 5000 and records.values("request_id").distinct().count() == 5000
    totals = records.aggregate(n=Count("id"), errors=Count("id", filter=Q(status_code__gte=400)),
                               prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    rolled = UsageRollup.objects.filter(tenant=tenant).aggregate(n=Sum("requests"), errors=Sum("errors"),
                                                                 prompt=Sum("prompt_tokens"),
                                                                 completion=Sum("completion_tokens"))
    assert rolled == totals
    hours = UsageHour.objects.filter(tenant=tenant).aggregate(n=Sum("requests"), errors=Sum("errors"),
                                                              prompt=Sum("prompt_tokens"),
                                                              completion=Sum("completion_tokens"))
    assert hours == totals
    seeded, seeded_hours = _rollup_figures(), _hour_figures()
    # The beat task's own computation over the whole period gives the very same rows.
    with override_settings(QUIVER_USAGE_ROLLUP_LOOKBACK_S=15 * 86400):
        usage_rollup(now=UNTIL)
    assert _rollup_figures() == seeded
    assert _hour_figures() == seeded_hours
