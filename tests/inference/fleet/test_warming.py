"""Heartbeats record node state and residency; routing prefers live nodes holding the version."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_version_upload, adapter_version_validate
from inference.fleet import tasks as fleet_tasks
from inference.fleet.models import Node, Placement, VersionIntent
from inference.fleet.nodes import node_heartbeat, node_mark_stale, node_register
from inference.fleet.warming import (
    placement_mark_load_issued,
    placement_mark_not_served,
    placement_on_ready,
    placement_request_warm,
    warm_target_node,
)
from inference.gateway.directory import load_target
from inference.gateway.fleet_reader import load_fleet
from inference.gateway.snapshot import NodeView, TargetView, node_choose
from inference.policy.hrw import hrw_order
from inference.policy.routing import RouteConfig

pytestmark = pytest.mark.django_db


def _state(name: str, adapters: list[dict] | None = None, **extra: object) -> dict:
    return {"node": name, "healthy": True, "base_model": "tiny-llama", "engine_url": f"http://{name}:8000",
            "agent_url": f"http://{name}:8100", "max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 16,
            "adapters": adapters or [], "kv_cache_usage_perc": 0.1, "num_requests_running": 0,
            "num_requests_waiting": 0, **extra}


def _beat(state: dict) -> Node:
    """Register the state's node (idempotent) and record its heartbeat, as if the control plane had asked the node to
    load each existing version it reports (a heartbeat records only those: ``test_node_trust``)."""
    node = Node.objects.filter(name=state["node"]).first()
    if node is None:
        node, _ = node_register(name=state["node"], agent_url=state["agent_url"], engine_url=state["engine_url"],
                                base_model_name="tiny-llama")
    for entry in state["adapters"]:
        if AdapterVersion.objects.filter(pk=entry["lora_int_id"]).exists():
            placement_mark_load_issued(node.pk, entry["lora_int_id"])
    return node_heartbeat(node=node, state=state)


def node_for(target: TargetView) -> NodeView | None:
    """The fast path's node choice over a fresh fleet read."""
    return node_choose(load_fleet(), target)


def _target(version: AdapterVersion) -> TargetView:
    target = load_target(version.tenant_id, version.adapter.name)
    assert isinstance(target, TargetView)
    return target


@pytest.fixture(autouse=True)
def _no_other_nodes() -> None:
    """Start from no nodes (rolled back after the test), whatever a reused database holds."""
    Node.objects.all().delete()


@pytest.fixture
def ready_version(make_client, base_model, tiny_adapters) -> AdapterVersion:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client(slug="acme")
    folder = tiny_adapters["qv-r8"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    version, _ = adapter_version_upload(tenant, adapter_name="bot", upload_files=files, base_model_name="tiny-llama")
    return adapter_version_validate(version)


def test_heartbeat_upserts_node_and_reconciles_residency(ready_version: AdapterVersion) -> None:
    """The engine's report of a pin marks the row where an operator pinned the version there (a node's word alone
    does not: ``test_node_capacity``); a fleet-wide pin, whose mark goes with the copy."""
    VersionIntent.objects.create(adapter_version=ready_version, pinned_fleet=True)
    entry = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "hot", "pinned": True}
    node = _beat(_state("n1", [entry, {"lora_name": "gone", "lora_int_id": 999999, "tier": "warm"}],
                                       kv_cache_usage_perc=0.42))
    assert node.base_model.base_model_name == "tiny-llama" and node.kv_cache_usage_perc == 0.42
    placement = Placement.objects.get(node=node, adapter_version=ready_version)
    assert (placement.tier, placement.pinned) == ("hot", True)
    assert Placement.objects.count() == 1  # unknown lora_int_id ignored
    _beat(_state("n1", []))
    placement.refresh_from_db()
    assert (placement.tier, placement.pinned) == ("cold", False)


def test_routing_prefers_hot_then_short_queue_and_skips_stale_nodes(ready_version: AdapterVersion) -> None:
    warm = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "warm"}
    hot = {**warm, "tier": "hot"}
    _beat(_state("a", [warm]))
    _beat(_state("b", [hot]))
    target = _target(ready_version)
    assert node_for(target).name == "b"  # equal load: the GPU slot wins
    _beat(_state("b", [hot], num_requests_waiting=3))
    assert node_for(target).name == "a"  # both in the engine: a swap costs less than 3 queued requests
    _beat(_state("b", [hot], num_requests_running=0))
    Node.objects.filter(name="b").update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert node_for(target).name == "a"
    assert node_mark_stale() == 1
    assert not Node.objects.get(name="b").healthy and Node.objects.get(name="a").healthy


def test_round_robin_spreads_over_every_node_and_affinity_keeps_to_the_holder(ready_version: AdapterVersion) -> None:
    """The baseline takes turns over all live nodes of the base model, holders or not (the gateway then warms the
    version where the turn fell); affinity keeps to the one node that holds it."""
    _beat(_state("a", [{"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "warm"}]))
    _beat(_state("b"))
    fleet, target = load_fleet(), _target(ready_version)
    pks = {n.name: n.pk for n in fleet.nodes}

    picks = [node_choose(fleet, target, policy="round_robin", turn=t).name for t in range(4)]  # type: ignore[union-attr]

    assert picks == ["a", "b", "a", "b"]
    assert {node_choose(fleet, target, turn=t).name for t in range(4)} == {"a"}  # type: ignore[union-attr]
    assert (fleet.serves(pks["a"], ready_version.pk), fleet.serves(pks["b"], ready_version.pk)) == (True, False)


def test_the_load_bound_decides_when_a_busy_home_spills_to_another_holder(ready_version: AdapterVersion) -> None:
    """Both nodes hold the version, the plan's home ``a`` runs 10 requests and ``b`` none: the default bound (1.35 x
    mean + 1 = 7.75) sends the request to ``b``; ``QUIVER_ROUTING_LOAD_BOUND`` 3 (bound 16) keeps it home."""
    held = [{"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "warm"}]
    _beat(_state("a", held, num_requests_running=10))
    _beat(_state("b", held))
    fleet = replace(load_fleet(), homes={ready_version.pk: ("a",)})
    target = _target(ready_version)

    assert node_choose(fleet, target).name == "b"  # type: ignore[union-attr]
    assert node_choose(fleet, target, config=RouteConfig(load_bound=3.0)).name == "a"  # type: ignore[union-attr]


def test_warm_request_is_enqueued_once(ready_version: AdapterVersion, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    node = _beat(_state("a"))
    assert warm_target_node(ready_version) == node
    with django_capture_on_commit_callbacks() as callbacks:
        placement_request_warm(ready_version, node=node)
        placement_request_warm(ready_version, node=node)
    assert len(callbacks) == 1
    assert Placement.objects.get(node=node, adapter_version=ready_version).warming_since is not None


def test_a_request_warm_skips_a_name_served_from_disk_unless_asked_to_load_it(
        ready_version: AdapterVersion, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    """A request to a name the engine serves from disk reloads it itself; the reconciler's pre-warm loads it."""
    node = _beat(_state("a", [{"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk,
                               "tier": "staged", "served": True}]))
    with django_capture_on_commit_callbacks() as skipped:
        placement_request_warm(ready_version, node=node)
    assert skipped == []
    with django_capture_on_commit_callbacks() as loaded:
        placement_request_warm(ready_version, node=node, even_if_served=True)
        placement_request_warm(ready_version, node=node, even_if_served=True)  # in flight: once
    assert len(loaded) == 1
    Placement.objects.filter(node=node, adapter_version=ready_version).update(tier="warm", warming_since=None)
    with django_capture_on_commit_callbacks() as resident:
        placement_request_warm(ready_version, node=node, even_if_served=True)
    assert resident == []


def test_a_warm_asked_of_a_node_gone_stale_goes_to_a_live_one(ready_version: AdapterVersion, settings,  # type: ignore[no-untyped-def]
                                                                django_capture_on_commit_callbacks) -> None:
    from inference.fleet.warming import warm_for_request as _warm_request

    dead, live = _beat(_state("dead")), _beat(_state("live"))
    Node.objects.filter(pk=dead.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S + 1))
    with django_capture_on_commit_callbacks():
        assert _warm_request(ready_version.pk, live.pk) == live.pk
        assert _warm_request(ready_version.pk, dead.pk) == live.pk  # killed, still marked healthy: not asked
    assert not Placement.objects.filter(node=dead, adapter_version=ready_version).exists()


def test_a_cold_warm_goes_to_the_versions_home_in_the_reconcilers_plan(ready_version: AdapterVersion, settings,  # type: ignore[no-untyped-def]
                                                                        django_capture_on_commit_callbacks) -> None:
    from common.redis import sync_client
    from inference.fleet.plan import plan_homes, plan_key, plan_publish
    from inference.fleet.warming import warm_for_request as _warm_request
    from tests.fixtures.fleet_plan import plan_forget

    emptiest, busy = _beat(_state("emptiest")), _beat(_state("busy", kv_cache_usage_perc=0.6))
    try:
        with django_capture_on_commit_callbacks():
            # No plan yet: the version's HRW-first node, where the reconciler's plan would put one replica.
            first = hrw_order(ready_version.pk, ["emptiest", "busy"])[0]
            assert _warm_request(ready_version.pk) == {"emptiest": emptiest, "busy": busy}[first].pk
            Placement.objects.all().delete()
            plan_publish({ready_version.pk: ("gone", "busy")})
            assert plan_homes(ready_version.pk) == ["gone", "busy"]
            assert _warm_request(ready_version.pk) == busy.pk  # its first live home
            assert _warm_request(ready_version.pk, emptiest.pk) == emptiest.pk  # a named live node still wins
    finally:
        sync_client().delete(plan_key())  # type: ignore[union-attr]
        plan_forget()
    assert plan_homes(ready_version.pk) == []


def test_affinity_moves_a_version_to_its_plans_home_unless_that_home_is_saturated(ready_version: AdapterVersion) -> None:
    """The reconciler's plan moved the version (bounded load by rate) from ``a``, which holds it, to ``b``:
    routing picks ``b`` so the caller warms it there, as the simulator routes; not while ``b`` is saturated."""
    from dataclasses import replace

    entry = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "warm", "served": True}
    _beat(_state("a", [entry]))
    _beat(_state("b"))
    fleet, target = load_fleet(), _target(ready_version)
    assert node_choose(fleet, target).name == "a"  # no plan: the holder
    planned = replace(fleet, homes={ready_version.pk: ("b",)})
    chosen = node_choose(planned, target)
    assert chosen is not None and chosen.name == "b" and not planned.serves(chosen.pk, ready_version.pk)
    assert node_choose(replace(planned, homes={ready_version.pk: ("a", "b")}), target).name == "a"  # home holds it
    _beat(_state("b", num_requests_waiting=9))
    assert node_choose(replace(load_fleet(), homes={ready_version.pk: ("b",)}), target).name == "a"
    assert node_choose(replace(load_fleet(), homes={ready_version.pk: ("gone",)}), target).name == "a"


def test_resolve_maps_names_and_hides_other_tenants(ready_version: AdapterVersion, make_client) -> None:  # type: ignore[no-untyped-def]
    tenant = ready_version.tenant
    bot = load_target(tenant.pk, "bot")
    assert isinstance(bot, TargetView) and bot.version_id == ready_version.pk
    assert bot.served_name == ready_version.served_name
    base = load_target(tenant.pk, "tiny-llama")
    assert isinstance(base, TargetView) and base.version_id is None and base.served_name == "tiny-llama"
    _, other, _ = make_client(slug="other")
    assert load_target(other.pk, "bot") == "not_found"


def test_a_name_still_served_from_disk_is_routable_without_a_warm(ready_version: AdapterVersion) -> None:
    entry = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "staged"}
    _beat(_state("disk-only", [{**entry, "served": False}]))
    target = _target(ready_version)
    assert node_for(target) is None
    _beat(_state("disk-only", [{**entry, "served": True}]))
    assert node_for(target).name == "disk-only"
    _beat(_state("warm-one", [{**entry, "tier": "warm", "served": True}]))
    assert node_for(target).name == "warm-one"


def test_an_engine_404_unroutes_the_node_and_the_next_warm_is_sent(  # type: ignore[no-untyped-def]
        ready_version: AdapterVersion, django_capture_on_commit_callbacks) -> None:
    # The gateway's view said "served" (a heartbeat before an evict); the engine answered 404 for the name.
    entry = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "warm"}
    node = _beat(_state("n1", [entry]))
    target = _target(ready_version)
    assert node_for(target).name == "n1"
    assert placement_mark_not_served(node.pk, ready_version.pk) == 1
    placement = Placement.objects.get(node=node, adapter_version=ready_version)
    assert (placement.tier, placement.served) == ("staged", False)
    assert node_for(target) is None  # not routed there again until it is reloaded
    with django_capture_on_commit_callbacks() as callbacks:
        placement_request_warm(ready_version, node=node)
    assert len(callbacks) == 1  # and a warm is sent (a row still marked served would have skipped it)
    assert placement_mark_not_served(node.pk, ready_version.pk) == 0  # a warm in flight is left alone


def test_warm_targets_only_nodes_whose_engine_takes_the_rank(ready_version: AdapterVersion) -> None:
    _beat(_state("small", max_lora_rank=4))
    base = ready_version.adapter.base_model
    assert base is not None
    assert warm_target_node(ready_version) is None  # r=8 > 4
    _beat(_state("big", max_lora_rank=16))
    assert warm_target_node(ready_version).name == "big"  # type: ignore[union-attr]


def test_a_new_ready_version_is_warmed_and_the_older_ones_stay(  # type: ignore[no-untyped-def]
        ready_version: AdapterVersion, tiny_adapters, django_capture_on_commit_callbacks, monkeypatch) -> None:
    """A new version takes no traffic until promoted (docs/versions.md), so the serving one is never evicted for it;
    the new one is warmed so that ``name@N`` and a later promotion find it loaded."""
    node = _beat(_state("a", [{"lora_name": ready_version.served_name,
                                              "lora_int_id": ready_version.pk, "tier": "warm", "served": True}]))
    folder = tiny_adapters["all-r16"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    newer, _ = adapter_version_upload(ready_version.tenant, adapter_name="bot", upload_files=files)
    newer = adapter_version_validate(newer)
    evicted: list[int] = []
    warmed: list[int] = []
    monkeypatch.setattr(fleet_tasks.placement_evict_task, "delay", evicted.append)
    monkeypatch.setattr(fleet_tasks.placement_warm_task, "delay", warmed.append)
    with django_capture_on_commit_callbacks(execute=True):
        placement_on_ready(newer)
    assert evicted == []
    assert Placement.objects.get(node=node, adapter_version=ready_version).tier == "warm"
    assert warmed == [Placement.objects.get(node=node, adapter_version=newer).pk]


def test_a_heartbeat_keeps_an_in_flight_warm_and_its_old_failure_stays_hidden(
        ready_version: AdapterVersion, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retried warm after a failed one: the node's next report (the version staged or errored, not yet loaded)
    must not clear the warm's mark, or the gateway answers the waiting request with the previous failure."""
    monkeypatch.setattr("inference.fleet.warming.enqueue_on_commit", lambda *a, **k: None)
    node = _beat(_state("n1"))
    Placement.objects.create(node=node, adapter_version=ready_version, tier="errored",
                             last_error="s3_object_missing: tenants/x is gone")
    assert load_fleet().warm_error(ready_version.pk) == "s3_object_missing"
    placement_request_warm(ready_version, node=node)
    assert load_fleet().warm_error(ready_version.pk) == ""

    staged = {"lora_name": ready_version.served_name, "lora_int_id": ready_version.pk, "tier": "errored"}
    _beat(_state("n1", [staged]))

    assert Placement.objects.get(node=node, adapter_version=ready_version).warming_since is not None
    assert load_fleet().warm_error(ready_version.pk) == ""
    _beat(_state("n1", [{**staged, "tier": "warm"}]))  # loaded: the warm is over
    assert Placement.objects.get(node=node, adapter_version=ready_version).warming_since is None


def test_the_fleet_read_takes_one_figure_of_each_stored_heartbeat_not_the_whole_body(
        base_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every gateway process reads the fleet twice a second: it fetched and parsed each node's whole stored heartbeat
    (10,000 adapters: ~1 MB, ~15 ms a node) for ``residency.gpu`` alone."""
    from inference.gateway import fleet_reader

    adapters = [{"lora_name": f"acme--a--{i}", "lora_int_id": i, "tier": "staged", "pinned": False, "served": True}
                for i in range(1, 10_001)]
    _beat(_state("a", residency={"gpu": 2, "cpu": 0}, max_loras=4))
    _beat(_state("b"))
    Node.objects.filter(name="a").update(state={"residency": {"gpu": 2, "cpu": 0}, "adapters": adapters})
    fetched: list[int] = []
    gpu_used = fleet_reader._gpu_used

    def measured(value: Any) -> int:
        fetched.append(len(value if isinstance(value, (str, bytes)) else json.dumps(value)))
        return gpu_used(value)

    monkeypatch.setattr(fleet_reader, "_gpu_used", measured)
    fleet = load_fleet()
    assert {n.name: n.gpu_used for n in fleet.nodes} == {"a": 2, "b": 0}
    assert sum(fetched) < 100, fetched
