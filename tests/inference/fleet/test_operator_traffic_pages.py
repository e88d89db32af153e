"""The operator's traffic table is paged (``GET /api/v1/operator/traffic?limit=&offset=&ordering=``): walking every
page gives the unpaged table's rows, in its order, each version once, with the same percentiles (computed for the
page's versions only, over the same latest records); a page costs the same queries however many versions had
traffic. The nodes page counts its nodes' recent failures in one grouped query (docs/scale-usage.md, "Operator pages at
64 nodes")."""

from __future__ import annotations

import functools
import random
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from adapters_app.models import Adapter, AdapterVersion, BaseModel
from inference.fleet.models import Node
from inference.metering import traffic
from inference.metering.models import UsageRecord
from inference.metering.traffic import traffic_table
from tenants.models import Tenant

pytestmark = pytest.mark.django_db
URL = "/api/v1/operator/traffic"
ORDERINGS = ("requests", "tokens_per_s", "failures", "tenant", "model")  # the row fields a page may be ordered by


@pytest.fixture
def op() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="ops-traffic", password="x", is_staff=True))
    return client


def _traffic(tenants: int, adapters: int, records: int, seed: int = 3) -> None:
    """``adapters`` adapters (``a000``…, two versions each) over ``tenants`` tenants and ``records`` usage records
    in the last 50 minutes: versions, base-model rows and pinned names at random, few distinct request counts (so
    the tie-breaks decide much of the order), random statuses, latencies and TTFTs."""
    rng = random.Random(seed)
    base = BaseModel.objects.create(base_model_name="traffic-base", architecture="LlamaForCausalLM", hf_config={},
                                    facts={})
    owners = Tenant.objects.bulk_create([Tenant(slug=f"t-{i:02d}", name=f"T {i}") for i in range(tenants)])
    made = Adapter.objects.bulk_create([Adapter(tenant=owners[i % tenants], name=f"a{i:03d}", base_model=base)
                                        for i in range(adapters)])
    versions = AdapterVersion.objects.bulk_create([
        AdapterVersion(tenant_id=a.tenant_id, adapter=a, number=n, sha256=f"{i:062x}{n:02x}", size_bytes=1,
                       s3_prefix=f"x/{i}/{n}/", files=[], status="ready")
        for i, a in enumerate(made) for n in (1, 2)])
    tenant_of = {t.pk: t for t in owners}
    now = timezone.now()
    rows = []
    for i in range(records):
        version = rng.choice([*versions, None])
        tenant = tenant_of[version.tenant_id] if version else rng.choice(owners)
        name = "traffic-base" if version is None else version.adapter.name + (
            f"@{version.number}" if i % 4 == 0 else "")
        rows.append(UsageRecord(
            tenant=tenant, adapter_version=version, model_name=name,
            version_number=version.number if version else None, endpoint="completions",
            status_code=rng.choice([200, 200, 200, 429, 503]), prompt_tokens=rng.randint(1, 5),
            completion_tokens=rng.randint(0, 3), latency_ms=rng.uniform(5, 500),
            ttft_ms=rng.uniform(1, 50) if rng.random() < 0.6 else None,
            created_at=now - timedelta(seconds=rng.uniform(1, 3000))))
    UsageRecord.objects.bulk_create(rows)


def _walk(client: APIClient, query: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Every row of the paged table, following ``next``; each page's shape and size checked."""
    rows: list[dict[str, Any]] = []
    body = client.get(URL, {**query, "limit": limit}).json()
    while True:
        assert set(body) == {"count", "next", "previous", "results"}
        assert len(body["results"]) <= limit
        rows += body["results"]
        if body["next"] is None:
            break
        body = client.get(body["next"]).json()
    assert len(rows) == body["count"]
    return rows


def _expected_order(rows: list[dict[str, Any]], ordering: str) -> list[dict[str, Any]]:
    """The unpaged rows as ``ordering`` should order them: the field in its direction, then tenant, model and
    version ascending (base model first), written out as a comparison rather than the code's two stable sorts."""
    field, desc = ordering.removeprefix("-"), ordering.startswith("-")

    def compare(a: dict[str, Any], b: dict[str, Any]) -> int:
        if a[field] != b[field]:
            return (-1 if a[field] < b[field] else 1) * (-1 if desc else 1)
        ta, tb = (a["tenant"], a["model"], a["version"] or 0), (b["tenant"], b["model"], b["version"] or 0)
        return -1 if ta < tb else 1 if ta > tb else 0

    return sorted(rows, key=functools.cmp_to_key(compare))


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["tenant"], r["model"], r["version"])


def test_walking_every_page_gives_the_unpaged_table_with_its_percentiles(op: APIClient,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _traffic(tenants=5, adapters=24, records=1200)
    # Percentiles read only the latest 40 records, so a version's figures depend on the cut: a page must cut
    # where the whole table cuts (over every version's records), not over its own versions' records.
    monkeypatch.setattr(traffic, "PERCENTILE_ROWS", 40)
    until = timezone.now() + timedelta(seconds=1)
    since = until - timedelta(hours=1)
    whole = traffic_table(UsageRecord.objects.all(), since=since, until=until)
    assert len(whole) > 40 and any(r["latency_ms_p50"] is None for r in whole)  # some versions only before the cut
    assert sum(r["latency_ms_p50"] is not None for r in whole) > 10
    assert len({r["requests"] for r in whole}) < len(whole) / 2  # many ties: the tie-break orders many rows
    query = {"since": since.isoformat(), "until": until.isoformat()}
    rows = _walk(op, query, limit=7)
    assert rows == whole  # same rows, same order, same percentiles and sparklines
    assert len({_key(r) for r in rows}) == len(rows)  # no version on two pages

    first = op.get(URL, query).json()
    assert first["count"] == len(whole) and first["previous"] is None and first["results"] == whole[:50]
    assert "limit=50" in first["next"] and "offset=50" in first["next"]
    past = op.get(URL, {**query, "offset": 999}).json()
    assert past["results"] == [] and past["count"] == len(whole)

    mine = traffic_table(UsageRecord.objects.filter(tenant__slug="t-03"), since=since, until=until)
    assert _walk(op, {**query, "tenant": "t-03"}, limit=4) == mine
    assert op.get(URL, {**query, "tenant": "nobody"}).json() == {"count": 0, "next": None, "previous": None,
                                                                 "results": []}


@pytest.mark.parametrize("ordering", [f"{sign}{field}" for field in ORDERINGS for sign in ("", "-")])
def test_every_ordering_is_total_across_pages(op: APIClient, ordering: str) -> None:
    _traffic(tenants=4, adapters=15, records=500, seed=11)
    until = timezone.now() + timedelta(seconds=1)
    since = until - timedelta(hours=1)
    whole = traffic_table(UsageRecord.objects.all(), since=since, until=until)
    rows = _walk(op, {"since": since.isoformat(), "until": until.isoformat(), "ordering": ordering}, limit=6)
    assert rows == _expected_order(whole, ordering)


def test_unknown_or_percentile_ordering_is_refused(op: APIClient) -> None:
    _traffic(tenants=1, adapters=1, records=5)
    for ordering in ("latency_ms_p95", "-ttft_ms_p50", "spark", "tenant_id"):
        bad = op.get(URL, {"ordering": ordering})
        assert bad.status_code == 400 and "ordering" in bad.json()["fields"], ordering


def test_percentiles_are_computed_for_the_page_only(op: APIClient) -> None:
    _traffic(tenants=3, adapters=30, records=900, seed=5)
    with CaptureQueriesContext(connection) as read:
        page = op.get(URL, {"limit": 5, "offset": 5}).json()["results"]
    [pct] = [q["sql"] for q in read.captured_queries if "PERCENTILE_CONT" in q["sql"]]
    on_page = {r["model"] for r in page}
    assert "tenants_tenant" not in pct  # grouped by the tenant's id: no join for the slug
    names = {f"a{i:03d}" for i in range(30)}
    assert {n for n in names if f"'{n}'" in pct} == on_page - {"traffic-base"}  # only the page's versions


def test_a_page_costs_the_same_queries_whatever_the_number_of_versions(op: APIClient) -> None:
    _traffic(tenants=2, adapters=3, records=60, seed=1)
    op.get(URL)  # the session and user lookups are the same on every call; warm anything lazy
    with CaptureQueriesContext(connection) as small:
        assert op.get(URL).status_code == 200
    UsageRecord.objects.all().delete()
    Tenant.objects.all().delete()
    BaseModel.objects.all().delete()
    _traffic(tenants=12, adapters=150, records=4000, seed=2)
    with CaptureQueriesContext(connection) as large:
        body = op.get(URL, {"since": "2h"}).json()
    assert body["count"] > 200 and len(body["results"]) == 50
    assert len(large.captured_queries) == len(small.captured_queries)
    with CaptureQueriesContext(connection) as day:  # hourly sparklines: the records and the hourly sums
        assert op.get(URL, {"since": "24h", "limit": 200}).status_code == 200
    assert len(day.captured_queries) == len(small.captured_queries) + 1


def test_nodes_page_counts_failures_in_one_grouped_query(op: APIClient, make_client: Any) -> None:
    base = BaseModel.objects.create(base_model_name="fail-base", architecture="LlamaForCausalLM", hf_config={},
                                    facts={})
    nodes = Node.objects.bulk_create([Node(name=f"n-{i:03d}", base_model=base, agent_url="http://a",
                                           engine_url="http://e", healthy=True) for i in range(9)])
    _, tenant, _ = make_client()
    now = timezone.now()
    want = {}
    rows = []
    for i, node in enumerate(nodes):
        want[node.name] = i % 4
        rows += [UsageRecord(tenant=tenant, node=node, model_name="x", endpoint="completions", status_code=502,
                             latency_ms=1.0, created_at=now - timedelta(seconds=10)) for _ in range(i % 4)]
        # Neither a caller's own 4xx nor a failure older than 5 minutes counts.
        rows += [UsageRecord(tenant=tenant, node=node, model_name="x", endpoint="completions", status_code=429,
                             latency_ms=1.0, created_at=now - timedelta(seconds=10)),
                 UsageRecord(tenant=tenant, node=node, model_name="x", endpoint="completions", status_code=500,
                             latency_ms=1.0, created_at=now - timedelta(minutes=6))]
    UsageRecord.objects.bulk_create(rows)
    got = {}
    for offset in (0, 4, 8):
        with CaptureQueriesContext(connection) as read:
            page = op.get("/api/v1/operator/nodes", {"limit": 4, "offset": offset}).json()["results"]
        got |= {n["name"]: n["failed_requests_5m"] for n in page}
        usage = [q["sql"] for q in read.captured_queries if "gateway_usagerecord" in q["sql"]]
        # One read of the records for the page, grouped by node; not a count correlated with each node's row.
        assert len(usage) == 1 and "GROUP BY" in usage[0] and "gateway_node" not in usage[0], usage
    assert got == want
    assert op.get("/api/v1/operator/nodes/n-003").json()["failed_requests_5m"] == 3  # one node counts its own
