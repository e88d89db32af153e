"""The reconcile loop converges toward the plan and operators' intent, and is idempotent."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet import tasks as fleet_tasks
from inference.fleet.models import Node, Placement, VersionIntent
from inference.fleet.reconcile import fleet_reconcile
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db
T0 = 1_000_000_000.0  # the passes' clock (epoch seconds) where a test runs several passes


@pytest.fixture(autouse=True)
def _no_plan_left_behind() -> Any:
    """Each pass publishes its plan and warm backoff to Redis (``fleet_plan``); later tests must not route or back off
    by this one's."""
    from inference.fleet.plan import plan_publish, warm_backoff_save
    from tests.fixtures.fleet_plan import plan_forget

    warm_backoff_save({})
    yield
    plan_publish({})
    plan_forget()
    warm_backoff_save({})


@pytest.fixture
def setup(base_model: Any) -> dict[str, Any]:
    Node.objects.all().delete()
    nodes = [Node.objects.create(name=f"n{i}", base_model=base_model, agent_url="http://a", engine_url="http://e",
                                 healthy=True, last_heartbeat_at=timezone.now(), max_loras=2, max_cpu_loras=4,
                                 max_lora_rank=16) for i in range(2)]
    tenant = TenantFactory(slug="acme")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="a" * 64, size_bytes=10,
                                            s3_prefix="x/", files=[], status="ready", r=8)
    return {"nodes": nodes, "version": version}


def test_min_replicas_are_warmed_once_even_when_run_twice(setup: dict[str, Any],
                                                          django_capture_on_commit_callbacks: Any) -> None:
    version = setup["version"]
    VersionIntent.objects.create(adapter_version=version, min_replicas=2)
    with django_capture_on_commit_callbacks() as first:
        assert fleet_reconcile() == 2
    assert len(first) == 2
    assert set(Placement.objects.filter(adapter_version=version, warming_since__isnull=False)
               .values_list("node__name", flat=True)) == {"n0", "n1"}
    with django_capture_on_commit_callbacks() as second:
        fleet_reconcile()  # warms in flight: nothing new is enqueued (idempotent, crash-safe)
    assert second == []
    Placement.objects.filter(adapter_version=version).update(tier="warm", served=True, warming_since=None)
    with django_capture_on_commit_callbacks() as converged:
        assert fleet_reconcile() == 0
    assert converged == []


def test_the_count_is_of_warms_enqueued_not_of_warms_skipped(setup: dict[str, Any],
                                                             django_capture_on_commit_callbacks: Any) -> None:
    """A warm ``placement_request_warm`` skips (already in flight) is not counted: each pass's figure is what it
    put on the queue."""
    version = setup["version"]
    VersionIntent.objects.create(adapter_version=version, min_replicas=2)
    counts, enqueued = [], []
    for i in range(3):
        with django_capture_on_commit_callbacks() as callbacks:
            counts.append(fleet_reconcile(now=T0 + 30 * i))
        enqueued.append(len(callbacks))
    Placement.objects.filter(adapter_version=version, node__name="n1").update(warming_since=None)  # a lost warm
    with django_capture_on_commit_callbacks() as callbacks:
        counts.append(fleet_reconcile(now=T0 + 90))
    enqueued.append(len(callbacks))
    assert enqueued == [2, 0, 0, 1]  # the later passes find both warms in flight, then re-send the lost one
    assert counts == enqueued


def test_a_warm_that_keeps_failing_or_being_undone_backs_off_and_starts_over_once_it_holds(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """Passes every 30 s: a pre-warm whose load keeps failing is asked for at 30 s doubling to 15 min (no longer on
    every pass); a load the engine undoes right after keeps its backoff; one the engine has held long enough starts
    over, so its next loss is warmed again at once."""
    version = setup["version"]
    VersionIntent.objects.create(adapter_version=version, min_replicas=1, max_replicas=1)  # one replica, pre-warmed
    rows = Placement.objects.filter(adapter_version=version)

    def reconcile(at: float) -> int:
        with django_capture_on_commit_callbacks() as callbacks:
            count = fleet_reconcile(now=T0 + at)
        assert count == len(callbacks)
        return count

    asked = []
    for at in range(0, 1860, 30):
        if reconcile(at):
            asked.append(at)
            rows.update(tier="errored", warming_since=None, last_error="load_failed: boom")  # the worker failed
    assert asked == [0, 30, 90, 210, 450, 930, 1830]
    rows.update(tier="warm", served=True, last_error="")  # the 1830 s warm worked...
    assert reconcile(1860) == 0
    rows.update(tier="staged", served=False)  # ...and the engine dropped it again before long
    assert [reconcile(at) for at in (1890, 2700, 2730)] == [0, 0, 1]  # still 15 min after the last ask
    rows.update(tier="warm", served=True, warming_since=None)
    assert reconcile(2760) == 0 and reconcile(2730 + 1800) == 0  # held twice the delay: settled
    rows.update(tier="staged", served=False)
    assert reconcile(2730 + 1830) == 1  # started over: warmed again on the next pass


def test_idle_version_gets_one_replica_and_a_pin_is_carried_out(setup: dict[str, Any],
                                                              django_capture_on_commit_callbacks: Any) -> None:
    version = setup["version"]
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 0  # no operator intent: a single replica loads on its next request
    VersionIntent.objects.create(adapter_version=version)  # a default row (an operator's read made it): no floor
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 0
    VersionIntent.objects.filter(adapter_version=version).update(max_replicas=1)  # replicas set: 1 to 1
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 1
    assert len(callbacks) == 1
    Placement.objects.all().delete()
    VersionIntent.objects.filter(adapter_version=version).update(pinned_nodes=["n1"])
    with django_capture_on_commit_callbacks():
        fleet_reconcile()
    pinned = Placement.objects.get(adapter_version=version, node__name="n1")
    assert pinned.pinned and pinned.warming_since is not None


def test_replicas_above_max_are_evicted_off_plan_first(setup: dict[str, Any],
                                                       django_capture_on_commit_callbacks: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    version = setup["version"]
    for node in setup["nodes"]:
        Placement.objects.create(node=node, adapter_version=version, tier="warm", served=True)
    VersionIntent.objects.create(adapter_version=version, min_replicas=1, max_replicas=1)
    evicted: list[int] = []
    monkeypatch.setattr(fleet_tasks.placement_evict_task, "delay", evicted.append)
    with django_capture_on_commit_callbacks(execute=True):
        assert fleet_reconcile() == 1
    assert len(evicted) == 1
    left = Placement.objects.exclude(pk=evicted[0]).get(adapter_version=version)
    with django_capture_on_commit_callbacks(execute=True):
        Placement.objects.filter(pk=evicted[0]).update(tier="staged", served=False)
        assert fleet_reconcile() == 0  # converged: one replica, the planned one kept
    assert left.tier == "warm"


def test_a_tenant_over_its_gpu_bytes_quota_loses_its_own_hot_adapters(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from inference.fleet.models import TenantResidencyQuota

    version = setup["version"]
    n0, n1 = setup["nodes"]
    Node.objects.filter(pk__in=[n0.pk, n1.pk]).update(state={"residency": {"gpu_slot_bytes": 1000}})
    other = AdapterVersion.objects.create(tenant=version.tenant, adapter=version.adapter, number=2, sha256="b" * 64,
                                          size_bytes=10, s3_prefix="y/", files=[], status="rejected", r=8)
    stranger = TenantFactory(slug="stranger")
    theirs_adapter = adapter_create(stranger, name="bot", base_model_name="tiny-llama")
    theirs = AdapterVersion.objects.create(tenant=stranger, adapter=theirs_adapter, number=1, sha256="c" * 64,
                                           size_bytes=10, s3_prefix="z/", files=[], status="ready", r=8)
    mine = [Placement.objects.create(node=n, adapter_version=v, tier="hot", served=True)
            for n, v in ((n0, version), (n1, version), (n0, other))]
    Placement.objects.create(node=n1, adapter_version=theirs, tier="hot", served=True)
    TenantResidencyQuota.objects.create(tenant=version.tenant, max_gpu_bytes=1500)  # room for one slot of 1000
    evicted: list[int] = []
    monkeypatch.setattr(fleet_tasks.placement_evict_task, "delay", evicted.append)
    with django_capture_on_commit_callbacks(execute=True):
        fleet_reconcile()
    assert len(evicted) == 2 and set(evicted) <= {p.pk for p in mine}  # never the other tenant's


def test_with_more_versions_than_cpu_slots_only_the_hottest_are_warmed_ahead(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """16 versions with traffic over 2 nodes × 4 CPU slots (bench_fleet): the plan names a node for every one, but
    pre-warming the 8 coldest would evict hotter ones; they wait for their requests."""
    from inference.metering.models import UsageRecord

    version = setup["version"]
    versions = [version] + [
        AdapterVersion.objects.create(tenant=version.tenant, adapter=adapter_create(
            version.tenant, name=f"bot{i}", base_model_name="tiny-llama"), number=1, sha256=f"{i:064x}",
            size_bytes=10, s3_prefix=f"v{i}/", files=[], status="ready", r=8) for i in range(1, 16)]
    for rank, v in enumerate(versions, start=1):  # Zipf-like: 32, 16, 10, 8, ... requests in the rate window
        UsageRecord.objects.bulk_create([
            UsageRecord(tenant=v.tenant, adapter_version=v, endpoint="completions", status_code=200, latency_ms=1.0)
            for _ in range(max(1, 32 // rank))])
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 0  # no replicated version, no operator floor: each loads on its next request
    for v in versions:  # an operator set one replica of each: the floor is what the reconciler warms
        VersionIntent.objects.create(adapter_version=v, min_replicas=1, max_replicas=1)
    with django_capture_on_commit_callbacks() as callbacks:
        asked = fleet_reconcile()
    assert 4 <= asked == len(callbacks) <= 8  # never past the fleet's 8 CPU slots (all 16 before)
    warming = set(Placement.objects.filter(warming_since__isnull=False).values_list("adapter_version_id", flat=True))
    assert {v.pk for v in versions[:4]} <= warming  # the hottest always fit
    per_node = {n: Placement.objects.filter(warming_since__isnull=False, node__name=n).count() for n in ("n0", "n1")}
    assert max(per_node.values()) <= 4, per_node
    from inference.fleet.plan import plan_all
    from tests.fixtures.fleet_plan import plan_forget

    plan_forget()  # read it back from Redis, as another process would
    shared = plan_all()  # the plan the gateways read: every version has a home
    assert set(shared) == {v.pk for v in versions} and all(len(shared[v.pk]) == 1 for v in versions)


def test_a_version_held_on_both_nodes_stays_on_the_home_of_the_last_pass(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """The plan of the last pass (in Redis) breaks the tie between two holders, so a re-plan does not move it."""
    from inference.fleet.plan import plan_all, plan_publish
    from inference.policy.hrw import hrw_order
    from tests.fixtures.fleet_plan import plan_forget

    version = setup["version"]
    for node in setup["nodes"]:
        Placement.objects.create(node=node, adapter_version=version, tier="warm", served=True)
    first, second = hrw_order(version.pk, ["n0", "n1"])
    with django_capture_on_commit_callbacks():
        fleet_reconcile()
    assert plan_all()[version.pk] == (first,)  # no previous plan: the HRW order
    plan_publish({version.pk: (second,)})
    plan_forget()  # read it back from Redis, as another worker process would
    with django_capture_on_commit_callbacks():
        fleet_reconcile()
    plan_forget()
    assert plan_all()[version.pk] == (second,)



def test_a_replica_evicted_to_disk_is_warmed_again_and_a_resident_one_is_not(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """Node agents drop adapters from the engine's CPU cache and keep their names served (tier ``staged``, served):
    that node no longer holds the replica the plan wants resident, so the pass warms it there again; the replica
    still in an engine is left alone."""
    version = setup["version"]
    n0, n1 = setup["nodes"]
    Placement.objects.create(node=n0, adapter_version=version, tier="warm", served=True)
    Placement.objects.create(node=n1, adapter_version=version, tier="staged", served=True)
    VersionIntent.objects.create(adapter_version=version, min_replicas=2)
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 1
    assert len(callbacks) == 1
    assert set(Placement.objects.filter(adapter_version=version, warming_since__isnull=False)
               .values_list("node__name", flat=True)) == {"n1"}
    with django_capture_on_commit_callbacks() as again:
        fleet_reconcile()  # the warm is in flight: nothing new is enqueued
    assert again == []


@pytest.mark.parametrize("intent", [{"pinned_nodes": ["n0"]}, {"max_replicas": 1}], ids=["pinned", "floor"])
def test_a_single_wanted_copy_served_from_disk_is_warmed_again(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any, intent: dict[str, Any]) -> None:
    """A pin, or the one replica an operator set replicas for, that the node's engine dropped to disk: loaded again
    (with its pin), and nothing more once it is back in the engine."""
    version = setup["version"]
    n0, _ = setup["nodes"]
    Placement.objects.create(node=n0, adapter_version=version, tier="staged", served=True)
    VersionIntent.objects.create(adapter_version=version, **intent)
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 1
    assert len(callbacks) == 1
    row = Placement.objects.get(adapter_version=version, node=n0)
    assert row.warming_since is not None and row.pinned == ("pinned_nodes" in intent)
    Placement.objects.filter(pk=row.pk).update(tier="warm", warming_since=None)
    report = {"lora_name": version.served_name, "lora_int_id": version.pk, "tier": "warm", "served": True,
              "pinned": "pinned_nodes" in intent}
    Node.objects.filter(pk=n0.pk).update(state={"adapters": [report]})  # the heartbeat after the warm
    with django_capture_on_commit_callbacks() as converged:
        assert fleet_reconcile() == 0
    assert converged == []


def test_trims_count_replicas_served_from_disk_and_skip_dead_nodes(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``max_replicas``: a copy served from disk still takes requests, so it is a replica to trim; a dead
    node's row is neither counted nor sent an eviction it cannot carry out (every pass would resend it)."""
    version = setup["version"]
    n0, n1 = setup["nodes"]
    Placement.objects.create(node=n0, adapter_version=version, tier="warm", served=True)
    off_disk = Placement.objects.create(node=n1, adapter_version=version, tier="staged", served=True)
    VersionIntent.objects.create(adapter_version=version, min_replicas=1, max_replicas=1)
    evicted: list[int] = []
    monkeypatch.setattr(fleet_tasks.placement_evict_task, "delay", evicted.append)
    monkeypatch.setattr("inference.fleet.reconcile.placement_request_warm_enqueued",
                        lambda *a, **k: (None, False))
    with django_capture_on_commit_callbacks(execute=True):
        fleet_reconcile()
    assert len(evicted) == 1 and evicted[0] in {off_disk.pk, Placement.objects.get(node=n0).pk}

    evicted.clear()
    Placement.objects.filter(adapter_version=version).update(tier="warm", served=True)  # both back in engines
    Node.objects.filter(pk=n1.pk).update(healthy=False)  # then n1 died holding its copy
    with django_capture_on_commit_callbacks(execute=True):
        fleet_reconcile()
    assert evicted == []  # one live replica: within max; nothing sent to the dead node


def test_a_pin_the_engine_lost_is_sent_again(setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """Loaded on its pinned node but the engine reports no pin (it restarted): the pass re-sends the warm, whose
    agent load pins it (``placement_warm_task`` takes the pin from the intent); once the engine reports it pinned,
    nothing more is sent."""
    version = setup["version"]
    n0 = setup["nodes"][0]
    Placement.objects.create(node=n0, adapter_version=version, tier="warm", served=True)
    VersionIntent.objects.create(adapter_version=version, pinned_nodes=["n0"])
    entry = {"lora_name": version.served_name, "lora_int_id": version.pk, "tier": "warm", "served": True}
    Node.objects.filter(pk=n0.pk).update(state={"adapters": [{**entry, "pinned": False}]})
    with django_capture_on_commit_callbacks() as sent:
        fleet_reconcile()
    assert len(sent) == 1
    assert Placement.objects.get(node=n0, adapter_version=version).warming_since is not None

    Placement.objects.filter(node=n0).update(warming_since=None)  # the warm ended; the engine pinned it
    Node.objects.filter(pk=n0.pk).update(state={"adapters": [{**entry, "pinned": True}]})
    with django_capture_on_commit_callbacks() as converged:
        fleet_reconcile()
    assert converged == []


def test_a_pass_reads_each_nodes_stored_heartbeat_a_bounded_number_of_times(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trim read the node's whole stored heartbeat once per resident or served row: quadratic in the adapters a
    node holds (400 served from disk: 400 copies of a body listing 400 adapters, each pass)."""
    import json

    from inference.fleet.models import TenantResidencyQuota

    version = setup["version"]
    n0, _ = setup["nodes"]
    versions = AdapterVersion.objects.bulk_create([
        AdapterVersion(tenant=version.tenant, adapter=version.adapter, number=i, sha256=f"{i:064x}", size_bytes=10,
                       s3_prefix=f"v{i}/", files=[], status="rejected", r=8) for i in range(2, 402)])
    Placement.objects.bulk_create([Placement(node=n0, adapter_version=v, tier="staged", served=True, load_issued_at=
                                             timezone.now()) for v in versions])
    state = {"residency": {"gpu_slot_bytes": 1000},
             "adapters": [{"lora_name": v.served_name, "lora_int_id": v.pk, "tier": "staged", "pinned": False,
                           "served": True} for v in versions]}
    Node.objects.filter(pk=n0.pk).update(state=state)
    TenantResidencyQuota.objects.create(tenant=version.tenant, max_gpu_bytes=10**9)
    decoded: list[int] = []
    loads = json.loads

    def counting_loads(data: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(len(data))
        return loads(data, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting_loads)
    with django_capture_on_commit_callbacks(), CaptureQueriesContext(connection) as queries:
        fleet_reconcile()
    assert sum(decoded) < 10 * len(json.dumps(state)), (len(decoded), sum(decoded))
    # Nor does the database extract from it once per placement row (each extraction detoasts the whole report):
    # the slot size is read per node, from the node table alone.
    node_table = f'FROM "{Node._meta.db_table}"'
    extracting = [q["sql"] for q in queries.captured_queries if re.search(r'"state"\s*(->|#>)', q["sql"])]
    assert extracting and all(node_table in sql and "JOIN" not in sql for sql in extracting), extracting


def test_a_pass_warms_no_version_an_effect_probe_refused_and_reads_only_that_key_of_its_report(
        setup: dict[str, Any], django_capture_on_commit_callbacks: Any) -> None:
    """The pass reads the validation report's ``effect_probe`` alone (PostgreSQL extracts it): a version refused as
    ``no_effect`` is left errored with no warm, one whose no-effect probe was overruled (``served``) is warmed, and
    the rest of a large report never reaches the pass."""
    version = setup["version"]
    tenant, adapter = version.tenant, version.adapter
    big = {"tensors": [{"name": f"t{i}", "shape": [8, 16]} for i in range(2000)]}
    AdapterVersion.objects.filter(pk=version.pk).update(
        validation_report={**big, "effect_probe": {"verdict": "no_effect", "served": False}})
    other = adapter_create(tenant, name="bot2", base_model_name="tiny-llama")
    served = AdapterVersion.objects.create(tenant=tenant, adapter=other, number=1, sha256="b" * 64, size_bytes=10,
                                           s3_prefix="y/", files=[], status="ready", r=8,
                                           validation_report={**big, "effect_probe": {"verdict": "no_effect",
                                                                                      "served": True}})
    for v in (version, served):
        VersionIntent.objects.create(adapter_version=v, min_replicas=2)
    assert adapter.pk != other.pk
    with django_capture_on_commit_callbacks() as callbacks, CaptureQueriesContext(connection) as queries:
        assert fleet_reconcile(now=T0) == 2
    assert len(callbacks) == 2
    whole = [q["sql"] for q in queries.captured_queries if re.search(r'"validation_report"(?!\s*->)', q["sql"])]
    assert whole == []
    warming = Placement.objects.filter(warming_since__isnull=False)
    assert set(warming.values_list("adapter_version_id", flat=True)) == {served.pk}
    refused = Placement.objects.filter(adapter_version=version)
    assert set(refused.values_list("tier", flat=True)) == {"errored"}
    assert all(p.last_error.startswith("no_effect") for p in refused)
