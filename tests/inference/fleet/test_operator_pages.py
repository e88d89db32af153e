"""The operator's fleet pages are bounded: ``GET /api/v1/operator/nodes`` and ``GET /api/v1/operator/residency`` are
paged (``?limit=&offset=``: 50 by default, at most 200), a page costs the same few queries however large the fleet,
and walking every page gives the figures the unpaged nodes list gave (every placement once, counted per tier)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from adapters_app.models import Adapter, AdapterVersion, BaseModel
from inference.fleet.models import Node, Placement
from tenants.models import Tenant

pytestmark = pytest.mark.django_db
TIERS = ("cold", "staged", "warm", "hot", "errored")


@pytest.fixture
def op() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="ops-pages", password="x", is_staff=True))
    return client


def _fleet(nodes: int, tenants: int, adapters: int, seed: int = 7) -> list[Placement]:
    """``nodes`` nodes (``n-000``…), ``adapters`` one-version adapters over ``tenants`` tenants, each version on 1
    to 3 random nodes in a random tier (a tenth pinned). Returns the placements."""
    rng = random.Random(seed)
    base = BaseModel.objects.create(base_model_name="pages-base", architecture="LlamaForCausalLM", hf_config={},
                                    facts={})
    owners = Tenant.objects.bulk_create([Tenant(slug=f"t-{i:02d}", name=f"T {i}") for i in range(tenants)])
    made = Adapter.objects.bulk_create([Adapter(tenant=owners[i % tenants], name=f"a{i:03d}", base_model=base)
                                        for i in range(adapters)])
    versions = AdapterVersion.objects.bulk_create([
        AdapterVersion(tenant_id=a.tenant_id, adapter=a, number=1, sha256=f"{i:064x}", size_bytes=1000 + i,
                       s3_prefix=f"x/{i}/", files=[], status="ready") for i, a in enumerate(made)])
    fleet = Node.objects.bulk_create([Node(name=f"n-{i:03d}", base_model=base, agent_url="http://a", engine_url="http://e",
                                           healthy=True) for i in range(nodes)])
    rows = [Placement(node=node, adapter_version=version, tier=rng.choice(TIERS), pinned=rng.random() < 0.1)
            for version in versions for node in rng.sample(fleet, rng.randint(1, min(3, nodes)))]
    return Placement.objects.bulk_create(rows)


def _walk(client: APIClient, path: str, limit: int) -> tuple[list[dict[str, Any]], int]:
    """Every row of a paged list, following ``next`` from ``?limit=``; and the number of pages."""
    rows: list[dict[str, Any]] = []
    url: str | None = f"{path}?limit={limit}"
    pages = 0
    while url:
        body = client.get(url).json()
        assert set(body) == {"count", "next", "previous", "results"}
        assert len(body["results"]) <= limit
        rows += body["results"]
        pages += 1
        url = body["next"]
    assert len(rows) == body["count"]
    return rows, pages


def test_nodes_are_paged_by_name_with_the_default_and_the_cap(op: APIClient) -> None:
    _fleet(nodes=205, tenants=3, adapters=10)
    first = op.get("/api/v1/operator/nodes").json()
    assert first["count"] == 205 and first["previous"] is None and len(first["results"]) == 50
    assert [n["name"] for n in first["results"]] == [f"n-{i:03d}" for i in range(50)]
    assert first["next"].endswith("/api/v1/operator/nodes?limit=50&offset=50")
    capped = op.get("/api/v1/operator/nodes", {"limit": 1000}).json()
    assert len(capped["results"]) == 200 and capped["next"].endswith("limit=200&offset=200")
    last = op.get("/api/v1/operator/nodes", {"limit": 10, "offset": 200}).json()
    assert [n["name"] for n in last["results"]] == [f"n-{i:03d}" for i in range(200, 205)] and last["next"] is None
    past = op.get("/api/v1/operator/nodes", {"offset": 999}).json()
    assert past["results"] == [] and past["count"] == 205


def test_walking_every_page_counts_each_placement_once(op: APIClient) -> None:
    placements = _fleet(nodes=23, tenants=4, adapters=60)
    nodes, pages = _walk(op, "/api/v1/operator/nodes", limit=5)
    assert pages == 5 and [n["name"] for n in nodes] == sorted(f"n-{i:03d}" for i in range(23))
    names = dict(Node.objects.values_list("pk", "name"))
    want_tiers: dict[str, Counter[str]] = {name: Counter(dict.fromkeys(TIERS, 0)) for name in names.values()}
    want_pinned: Counter[str] = Counter()
    for p in placements:
        want_tiers[names[p.node_id]][p.tier] += 1
        want_pinned[names[p.node_id]] += p.pinned
    assert {n["name"]: n["tiers"] for n in nodes} == {k: dict(v) for k, v in want_tiers.items()}
    assert {n["name"]: n["pinned"] for n in nodes} == {k: want_pinned[k] for k in names.values()}
    assert sum(sum(n["tiers"].values()) for n in nodes) == len(placements)

    rows, pages = _walk(op, "/api/v1/operator/residency", limit=7)
    assert pages == 9 and len(rows) == 60  # one row per placed version, 60 / 7 rounded up
    cells = [(r["version_id"], c["node"], c["tier"], c["pinned"], c["id"]) for r in rows for c in r["placements"]]
    assert sorted(cells) == sorted((p.adapter_version_id, names[p.node_id], p.tier, p.pinned, p.pk)
                                   for p in placements)
    assert [(r["tenant"], r["adapter"]) for r in rows] == sorted((r["tenant"], r["adapter"]) for r in rows)
    for r in rows:  # a version's cells are on one page, by node name
        assert [c["node"] for c in r["placements"]] == sorted(c["node"] for c in r["placements"])


def test_residency_map_filters_by_tenant_and_leaves_out_unplaced_versions(op: APIClient) -> None:
    placements = _fleet(nodes=6, tenants=3, adapters=12)
    unplaced = AdapterVersion.objects.get(adapter__name="a000")
    Placement.objects.filter(adapter_version=unplaced).delete()
    rows = op.get("/api/v1/operator/residency", {"tenant": "t-01"}).json()
    slugs = dict(AdapterVersion.objects.values_list("pk", "tenant__slug"))
    want = sorted({p.adapter_version_id for p in placements if slugs[p.adapter_version_id] == "t-01"})
    assert rows["count"] == len(want) == 4 and sorted(r["version_id"] for r in rows["results"]) == want
    everyone = op.get("/api/v1/operator/residency").json()
    assert everyone["count"] == 11 and unplaced.pk not in {r["version_id"] for r in everyone["results"]}
    assert op.get("/api/v1/operator/residency", {"tenant": "nobody"}).json()["count"] == 0
    bad = op.get("/api/v1/operator/residency", {"tenant": "not a slug"})
    assert bad.status_code == 400 and "tenant" in bad.json()["fields"]


@pytest.mark.parametrize("path", ["/api/v1/operator/nodes", "/api/v1/operator/residency"])
def test_a_page_costs_the_same_queries_at_any_fleet_size(op: APIClient, path: str) -> None:
    _fleet(nodes=4, tenants=2, adapters=4, seed=1)
    op.get(path)  # the session and user lookups are the same on every call; warm anything lazy
    with CaptureQueriesContext(connection) as small:
        assert op.get(path).status_code == 200
    Node.objects.all().delete()
    Tenant.objects.all().delete()
    BaseModel.objects.all().delete()
    _fleet(nodes=120, tenants=10, adapters=300, seed=2)
    with CaptureQueriesContext(connection) as large:
        body = op.get(path).json()
    assert len(body["results"]) == 50
    assert len(large.captured_queries) == len(small.captured_queries)


def test_one_node_shows_its_counts_too(op: APIClient) -> None:
    placements = _fleet(nodes=2, tenants=1, adapters=8)
    node = Node.objects.get(name="n-001")
    row = op.get("/api/v1/operator/nodes/n-001").json()
    mine = [p for p in placements if p.node_id == node.pk]
    assert sum(row["tiers"].values()) == len(mine) and row["pinned"] == sum(p.pinned for p in mine)
    assert set(row["tiers"]) == set(TIERS)
