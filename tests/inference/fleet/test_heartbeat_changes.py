"""Change-only heartbeats (``inference.fleet.nodes.node_heartbeat``, ``inference.policy.node_report``): a report that
changes nothing writes no placement row and reads no version; one that changes some rows writes exactly those;
whatever another writer did to the rows since (an unpin, a pin's mark, a deleted version) is still taken up
by an unchanged report; and the agent gets the same answer either way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from adapters_app.models import AdapterVersion, Purge
from adapters_app.services import adapter_create
from inference.fleet.models import Node, Placement, TenantResidencyQuota, VersionIntent
from inference.fleet.nodes import node_register
from inference.fleet.plan import plan_publish
from tests.factories import TenantFactory
from tests.fixtures.bus import bus_listener

pytestmark = pytest.mark.django_db
URL = "/internal/v1/nodes/heartbeat"
COUNT = 40  # about what each node held in the 64-node scale run (2,756 placements)
TIERS = ["hot"] * 4 + ["warm"] * 12 + ["staged"] * (COUNT - 16)


@pytest.fixture
def internal() -> Any:
    with override_settings(ROOT_URLCONF="config.internal_urls"):
        yield Client()


@pytest.fixture
def fleet(base_model: Any) -> dict[str, Any]:
    """Node ``n1`` holding ``COUNT`` versions it was asked to load, and the report that says so."""
    _, creds = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                             base_model_name="tiny-llama")
    tenant = TenantFactory(slug="acme")
    node = Node.objects.get(name="n1")
    versions = []
    for i, tier in enumerate(TIERS):
        adapter = adapter_create(tenant, name=f"bot{i}", base_model_name="tiny-llama")
        version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=f"{i % 10}" * 64,
                                                size_bytes=10, s3_prefix=f"acme{i}/", files=[], status="ready", r=8)
        Placement.objects.create(node=node, adapter_version=version, tier=tier, served=True,
                                 load_issued_at=timezone.now())
        versions.append(version)
    adapters = [{"lora_name": v.served_name, "lora_int_id": v.pk, "tier": tier, "pinned": False, "served": True,
                 "bytes": 80 << 20, "loads": 1} for v, tier in zip(versions, TIERS, strict=True)]
    state = {"node": "n1", "healthy": True, "base_model": "tiny-llama", "engine_url": "http://n1:8000",
             "agent_url": "http://n1:8100", "max_loras": 4, "max_cpu_loras": 16, "max_lora_rank": 16,
             "adapters": adapters, "residency": {"source": "engine", "gpu": 4, "cpu": 12, "gpu_slot_bytes": 1000},
             "kv_cache_usage_perc": 0.1, "num_requests_running": 0, "num_requests_waiting": 0}
    return {"token": creds.token, "state": state, "versions": versions, "node": node}


def _beat(client: Client, fleet: dict[str, Any], **changes: Any) -> Any:
    resp = client.post(URL, data=json.dumps({**fleet["state"], **changes}), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {fleet['token']}")
    assert resp.status_code == 200, resp.content
    return resp.json()


def _rows() -> dict[int, tuple[Any, ...]]:
    return {pk: rest for pk, *rest in Placement.objects.values_list(
        "pk", "tier", "pinned", "served", "warming_since", "updated_at")}


def _writes(ctx: CaptureQueriesContext, table: str) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries
            if q["sql"].startswith(("UPDATE", "INSERT", "DELETE")) and f'"{table}"' in q["sql"].split(" WHERE")[0]]


def test_an_unchanged_heartbeat_writes_no_placement_row_and_reads_no_version(internal: Client,
                                                                             fleet: dict[str, Any]) -> None:
    _beat(internal, fleet)
    before, seen = _rows(), Node.objects.get(name="n1").last_heartbeat_at

    with CaptureQueriesContext(connection) as ctx:
        _beat(internal, fleet, num_requests_running=3)  # the gauges move; the residency does not

    assert _writes(ctx, "gateway_placement") == []
    assert not [q for q in ctx.captured_queries if 'FROM "adapters_adapterversion"' in q["sql"]]  # the lookup
    assert _rows() == before
    node = Node.objects.get(name="n1")
    assert node.last_heartbeat_at > seen and node.num_requests_running == 3 and node.healthy
    (update,) = _writes(ctx, "gateway_node")  # liveness and the gauges: one UPDATE of what moved
    assert '"last_heartbeat_at"' in update and '"agent_url"' not in update


def test_a_changed_heartbeat_writes_exactly_the_changed_rows(internal: Client, fleet: dict[str, Any]) -> None:
    """Only the rows whose tier, pin or served mark moved are written (and stamped), one UPDATE per distinct set of
    values: here two rows left their GPU slots alike, one was reloaded from disk, one was pinned by the engine (where
    an operator pinned it: the intent, made before, writes no row)."""
    VersionIntent.objects.create(adapter_version=fleet["versions"][5], pinned_nodes=["n1"])
    _beat(internal, fleet)
    before = _rows()
    adapters = [dict(a) for a in fleet["state"]["adapters"]]
    adapters[0]["tier"] = adapters[1]["tier"] = "warm"
    adapters[20]["tier"] = "hot"
    adapters[5]["pinned"] = True
    moved = {fleet["versions"][i].pk for i in (0, 1, 5, 20)}

    with CaptureQueriesContext(connection) as ctx:
        _beat(internal, fleet, adapters=adapters)

    assert len(_writes(ctx, "gateway_placement")) == 3
    after = _rows()
    by_version = dict(Placement.objects.values_list("pk", "adapter_version_id"))
    assert {by_version[pk] for pk in after if after[pk] != before[pk]} == moved
    rows = {v: (t, p) for v, t, p in Placement.objects.values_list("adapter_version_id", "tier", "pinned")}
    v = fleet["versions"]
    assert [rows[v[i].pk] for i in (0, 1, 5, 20)] == [("warm", False), ("warm", False), ("warm", True), ("hot", False)]


def test_a_node_restarting_with_an_empty_cache_drops_every_row_to_cold(internal: Client,
                                                                       fleet: dict[str, Any]) -> None:
    _beat(internal, fleet)
    _beat(internal, fleet)

    _beat(internal, fleet, adapters=[], residency={"source": "engine", "gpu": 0, "cpu": 0})

    assert set(Placement.objects.values_list("tier", "served", "pinned")) == {("cold", False, False)}


def test_an_unpin_between_unchanged_heartbeats_takes_the_mark_off(internal: Client, fleet: dict[str, Any]) -> None:
    """The operator's pin held the row's mark while the engine did not report one; unpinning changes no placement
    row (the evict comes later), yet the next heartbeat, with the same report, takes the mark off."""
    version = fleet["versions"][1]
    VersionIntent.objects.create(adapter_version=version, pinned_nodes=["n1"])
    Placement.objects.filter(adapter_version=version).update(pinned=True)
    _beat(internal, fleet)
    _beat(internal, fleet)
    assert Placement.objects.get(adapter_version=version).pinned

    VersionIntent.objects.filter(adapter_version=version).update(pinned_nodes=[])
    _beat(internal, fleet)

    assert not Placement.objects.get(adapter_version=version).pinned


def test_a_mark_written_without_a_new_timestamp_is_still_seen(internal: Client, fleet: dict[str, Any]) -> None:
    """Writers that set ``pinned`` with a plain UPDATE leave ``updated_at`` alone: the digest covers the rows'
    fields, not their times, so the next unchanged report still decides (no pin covers the mark: it goes)."""
    _beat(internal, fleet)
    version = fleet["versions"][2]
    Placement.objects.filter(adapter_version=version).update(pinned=True)

    _beat(internal, fleet)

    assert not Placement.objects.get(adapter_version=version).pinned


def test_a_version_deleted_on_the_control_plane_is_purged_from_the_node(internal: Client,
                                                                        fleet: dict[str, Any]) -> None:
    _beat(internal, fleet)
    _beat(internal, fleet)
    version = fleet["versions"][3]
    name = version.served_name

    AdapterVersion.objects.filter(pk=version.pk).delete()  # its placements go with it
    _beat(internal, fleet)

    assert Purge.objects.filter(kind=Purge.Kind.NODE, node_id=fleet["node"].pk, lora_name=name).exists()


def test_an_unasked_version_is_taken_once_asked_even_by_a_plain_update(internal: Client,
                                                                       fleet: dict[str, Any]) -> None:
    """A reported version the node was never asked to load is ignored, and the accept still settles; the mark that
    asks for it later is a plain UPDATE of ``load_issued_at`` (no new ``updated_at``), which the digest shows."""
    version = fleet["versions"][6]
    Placement.objects.filter(adapter_version=version).update(load_issued_at=None, tier="cold", served=False)
    _beat(internal, fleet)
    _beat(internal, fleet)
    assert Node.objects.get(name="n1").residency_digest != ""
    assert Placement.objects.get(adapter_version=version).tier == "cold"

    Placement.objects.filter(adapter_version=version).update(load_issued_at=timezone.now())
    _beat(internal, fleet)

    assert Placement.objects.get(adapter_version=version).tier == "warm"


def test_an_unasked_version_without_a_row_is_purged_once_deleted(internal: Client, fleet: dict[str, Any]) -> None:
    """No row on the node shows its deletion, so the accept checks that the versions it names without a row still
    exist; a deleted one is garbage on the node, as before."""
    tenant = fleet["versions"][0].tenant
    adapter = adapter_create(tenant, name="stray", base_model_name="tiny-llama")
    stray = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="f" * 64, size_bytes=10,
                                          s3_prefix="stray/", files=[], status="ready", r=8)
    entry = {"lora_name": stray.served_name, "lora_int_id": stray.pk, "tier": "staged", "pinned": False,
             "served": False}
    adapters = [*fleet["state"]["adapters"], entry]
    _beat(internal, fleet, adapters=adapters)
    _beat(internal, fleet, adapters=adapters)
    assert Node.objects.get(name="n1").residency_digest != ""
    assert not Purge.objects.filter(lora_name=entry["lora_name"]).exists()

    AdapterVersion.objects.filter(pk=stray.pk).delete()
    _beat(internal, fleet, adapters=adapters)

    assert Purge.objects.filter(kind=Purge.Kind.NODE, node_id=fleet["node"].pk, lora_name=entry["lora_name"]).exists()


def test_the_answer_is_the_same_whether_the_report_changed_or_not(internal: Client, fleet: dict[str, Any]) -> None:
    """What the agent relies on: ``elsewhere`` (the plan puts these on other nodes only) and ``over_quota`` (their
    tenant's GPU bytes reached its quota) come with every heartbeat, from a full accept or a skipped one."""
    v = fleet["versions"]
    plan_publish({v[0].pk: ("n2",), v[1].pk: ("n1", "n2"), v[30].pk: ("n2",)})
    TenantResidencyQuota.objects.create(tenant=v[0].tenant, max_gpu_bytes=1000)
    first = _beat(internal, fleet)  # decided in full
    digest = Node.objects.get(name="n1").residency_digest

    with CaptureQueriesContext(connection) as ctx:
        second = _beat(internal, fleet)  # skipped

    assert digest and Node.objects.get(name="n1").residency_digest == digest
    assert _writes(ctx, "gateway_placement") == []
    assert first == second
    assert first["node"] == "n1" and first["healthy"] is True
    assert first["elsewhere"] == [v[0].pk, v[30].pk]
    assert first["over_quota"] == sorted(x.pk for x in v)


def test_a_heartbeat_that_drops_copies_tells_the_gateways_to_reread_now(internal: Client, fleet: dict[str, Any],
                                                                        django_capture_on_commit_callbacks: Any) -> None:
    """Without the message each gateway kept routing to the dropped copies until its next refresh (each request a
    404 from the engine and a reroute); an unchanged report sends nothing."""
    with bus_listener() as drain:
        with django_capture_on_commit_callbacks(execute=True):
            _beat(internal, fleet)
            _beat(internal, fleet)
        assert ("placements", None) not in drain()
        adapters = [dict(a) for a in fleet["state"]["adapters"]][:-3]  # the node evicted three copies itself
        with django_capture_on_commit_callbacks(execute=True):
            _beat(internal, fleet, adapters=adapters)
        assert drain().count(("placements", None)) == 1
