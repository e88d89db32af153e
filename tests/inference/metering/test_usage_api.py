"""``GET /api/v1/usage``: per-version token totals, only the caller's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.metering.models import UsageRecord
from inference.metering.rollups import usage_rollup

pytestmark = pytest.mark.django_db


def _version(tenant, name: str) -> AdapterVersion:  # type: ignore[no-untyped-def]
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    return AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=name * 4, size_bytes=1,
                                         s3_prefix="x/", files=[], status="ready")


def test_usage_is_summed_per_version_and_scoped(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    _, other, _ = make_client()
    mine, theirs = _version(tenant, "bot"), _version(other, "bot")
    for version, tokens in ((mine, 5), (mine, 7), (theirs, 100)):
        UsageRecord.objects.create(tenant=version.tenant, adapter_version=version, base_model=base_model,
                                   model_name="bot", version_number=1, endpoint="completions", status_code=200, prompt_tokens=2,
                                   completion_tokens=tokens, latency_ms=1.0)
    UsageRecord.objects.create(tenant=tenant, base_model=base_model, model_name="tiny-llama", endpoint="completions",
                               status_code=200,
                               prompt_tokens=3, completion_tokens=4, latency_ms=1.0)
    UsageRecord.objects.create(tenant=tenant, adapter_version=mine, base_model=base_model, model_name="bot@1",
                               version_number=1, endpoint="completions", status_code=200, prompt_tokens=1,
                               completion_tokens=1, latency_ms=1.0)
    rows = client.get("/api/v1/usage").json()
    assert rows == [
        {"model": "bot", "adapter": "bot", "version": 1, "requests": 2, "prompt_tokens": 4, "completion_tokens": 12},
        {"model": "bot@1", "adapter": "bot", "version": 1, "requests": 1, "prompt_tokens": 1, "completion_tokens": 1},
        {"model": "tiny-llama", "adapter": None, "version": None, "requests": 1, "prompt_tokens": 3,
         "completion_tokens": 4},
    ]
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert client.get("/api/v1/usage", {"since": future}).json() == []
    bad = client.get("/api/v1/usage", {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()["fields"]


def _beat_ran() -> None:
    """The rollups and hourly sums of the last 3 h, as the beat task keeps them: final hours are read from the sums."""
    with override_settings(QUIVER_USAGE_ROLLUP_LOOKBACK_S=3 * 3600):
        usage_rollup()


def test_usage_takes_a_time_range_and_exports_csv(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    _, other, _ = make_client()
    now = timezone.now()
    for owner, minutes_ago, tokens, status in ((tenant, 90, 5, 200), (tenant, 30, 7, 499), (other, 30, 100, 200)):
        UsageRecord.objects.create(tenant=owner, base_model=base_model, model_name="tiny-llama", endpoint="completions",
                                   stream=True, status_code=status, prompt_tokens=2, completion_tokens=tokens,
                                   latency_ms=9.5, ttft_ms=1.5, created_at=now - timedelta(minutes=minutes_ago))
    _beat_ran()
    hour_ago = (now - timedelta(hours=1)).isoformat()
    rows = client.get("/api/v1/usage", {"until": hour_ago}).json()
    assert [r["completion_tokens"] for r in rows] == [5]
    assert [r["completion_tokens"] for r in client.get("/api/v1/usage", {"since": hour_ago}).json()] == [7]
    bad = client.get("/api/v1/usage", {"since": now.isoformat(), "until": hour_ago})
    assert bad.status_code == 400 and "until" in bad.json()["fields"]
    export = client.get("/api/v1/usage", {"export": "csv"})
    assert export.status_code == 200 and export["Content-Type"] == "text/csv"
    lines = b"".join(export).decode().splitlines()  # as a WSGI server reads it; ASGI reads it in batches
    assert lines[0].startswith("created_at,model,version,endpoint,stream,status_code,prompt_tokens")
    assert [line.split(",")[5:8] for line in lines[1:]] == [["200", "2", "5"], ["499", "2", "7"]]  # theirs absent


@pytest.mark.parametrize(("path", "fields"), [("/api/v1/usage", ("since", "until")), ("/api/v1/usage/series", ("since",)),
                                             ("/api/v1/usage/traffic", ("since", "until")),
                                             ("/api/v1/usage/rollups", ("since", "until")),
                                             ("/api/v1/usage/versions", ("since", "until"))])
def test_every_since_and_until_takes_a_span_back_from_now(  # type: ignore[no-untyped-def]
        make_client, base_model, path: str, fields: tuple[str, ...]) -> None:
    client, tenant, _ = make_client()
    _version(tenant, "bot")
    base = {"adapter": "bot"} if path.endswith("versions") else {}
    for field in fields:
        for span in ("15m", "1h", "24h", "7d"):
            assert client.get(path, {**base, field: span}).status_code == 200, (field, span)
        for value in ("yesterday", "1y", "-1h", "999999999w"):
            bad = client.get(path, {**base, field: value})
            body = bad.json()
            assert bad.status_code == 400 and body["code"] == "invalid" and field in body["fields"], (field, value)
            assert f"'{field}'" in body["detail"] and "ISO 8601" in body["detail"] and "24h" in body["detail"], body
    if "until" in fields:
        assert client.get(path, {**base, "since": "2h", "until": "1h"}).status_code == 200


def test_a_span_counts_back_from_now(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    now = timezone.now()
    for minutes_ago, tokens in ((90, 5), (30, 7)):
        UsageRecord.objects.create(tenant=tenant, base_model=base_model, model_name="tiny-llama", endpoint="completions",
                                   status_code=200, prompt_tokens=2, completion_tokens=tokens, latency_ms=1.0,
                                   created_at=now - timedelta(minutes=minutes_ago))
    _beat_ran()
    assert [r["completion_tokens"] for r in client.get("/api/v1/usage", {"since": "1h"}).json()] == [7]
    assert [r["completion_tokens"] for r in client.get("/api/v1/usage", {"until": "1h"}).json()] == [5]
    assert [r["completion_tokens"] for r in client.get("/api/v1/usage", {"since": "2h"}).json()] == [12]


def test_traffic_shows_a_version_once_whether_it_was_called_by_name_or_pinned(  # type: ignore[no-untyped-def]
        make_client, base_model) -> None:
    """``bot`` and ``bot@1`` reaching version 1 are one traffic row (two "bot v1" rows with different figures: a fresh
    user's finding); counts, failures, tokens, percentiles and the sparkline cover both."""
    client, tenant, _ = make_client()
    mine = _version(tenant, "bot")
    for name, latency, status in (("bot", 10.0, 200), ("bot", 20.0, 200), ("bot@1", 30.0, 429)):
        UsageRecord.objects.create(tenant=tenant, adapter_version=mine, base_model=base_model, model_name=name,
                                   version_number=1, endpoint="completions", status_code=status, prompt_tokens=2,
                                   completion_tokens=1, latency_ms=latency)
    rows = client.get("/api/v1/usage/traffic").json()
    assert [(r["model"], r["version"], r["requests"], r["failures"], r["prompt_tokens"], sum(r["spark"]))
            for r in rows] == [("bot", 1, 3, 1, 6, 3)]
    assert rows[0]["latency_ms_p50"] == 20.0


def test_traffic_rates_keep_low_but_real_rates(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    """One request of 3 tokens in a day is a rate, not 0.0 (fresh-user round, issue 30: rates were rounded to 3 and 4
    decimal places, so a quiet adapter's tokens/s read 0.0)."""
    client, tenant, _ = make_client()
    mine = _version(tenant, "bot")
    UsageRecord.objects.create(tenant=tenant, adapter_version=mine, base_model=base_model, model_name="bot",
                               version_number=1, endpoint="completions", status_code=200, prompt_tokens=2,
                               completion_tokens=1, latency_ms=1.0)
    [row] = client.get("/api/v1/usage/traffic", {"since": "24h"}).json()
    assert row["tokens_per_s"] == pytest.approx(3 / 86400, rel=0.01) and row["tokens_per_s"] > 0
    assert row["requests_per_s"] == pytest.approx(1 / 86400, rel=0.01)
