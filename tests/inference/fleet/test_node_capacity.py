"""A stolen node credential cannot decide its own capacity nor make pins (attack round): the capacity placement and
routing use is ``min(reported, ceiling)`` (the operator's ceiling from ``quiver_node_register``, else the fleet's),
and a row's ``pinned`` is an operator's pin, never the node's word. On real PostgreSQL, through real heartbeats."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import Node, Placement, VersionIntent
from inference.fleet.nodes import node_register
from inference.fleet.reconcile import fleet_reconcile, fleet_trim
from inference.fleet.warming import placement_mark_load_issued, placement_warm
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db
URL = "/internal/v1/nodes/heartbeat"


@pytest.fixture(autouse=True)
def _clean(base_model: Any) -> Any:
    """No other nodes; no plan or warm backoff left in Redis for later tests (``fleet_plan``)."""
    from inference.fleet.plan import plan_publish, warm_backoff_save
    from tests.fixtures.fleet_plan import plan_forget

    Node.objects.all().delete()
    warm_backoff_save({})
    yield
    plan_publish({})
    plan_forget()
    warm_backoff_save({})


@pytest.fixture
def internal() -> Any:
    with override_settings(ROOT_URLCONF="config.internal_urls"):
        yield Client()


def _register(name: str, **ceilings: int | None) -> str:
    _, creds = node_register(name=name, agent_url=f"http://{name}:8100", engine_url=f"http://{name}:8000",
                             base_model_name="tiny-llama", ceilings=ceilings)
    return creds.token


def _beat(client: Client, token: str, name: str, **extra: Any) -> None:
    state = {"node": name, "healthy": True, "base_model": "tiny-llama", "max_loras": 2, "max_cpu_loras": 4,
             "max_lora_rank": 16, "adapters": [], "kv_cache_usage_perc": 0.0, "num_requests_running": 0,
             "num_requests_waiting": 0, **extra}
    resp = client.post(URL, data=json.dumps(state), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 200, resp.content


def _versions(count: int) -> list[AdapterVersion]:
    """``count`` ready versions over three tenants."""
    out = []
    tenants = [TenantFactory(slug=f"t{i}") for i in range(3)]
    for i in range(count):
        tenant = tenants[i % 3]
        adapter = adapter_create(tenant, name=f"a{i}", base_model_name="tiny-llama")
        out.append(AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=f"{i % 10}" * 64,
                                                 size_bytes=10, s3_prefix=f"{tenant.slug}/{i}/", files=[],
                                                 status="ready", r=8))
    return out


def _entry(version: AdapterVersion, tier: str = "warm", **extra: Any) -> dict[str, Any]:
    return {"lora_name": version.served_name, "lora_int_id": version.pk, "tier": tier, "pinned": False,
            "served": True, **extra}


@override_settings(QUIVER_NODE_MAX_LORAS_CEILING=2, QUIVER_NODE_MAX_CPU_LORAS_CEILING=6)
def test_a_node_claiming_100000_slots_gets_no_more_warms_than_its_ceiling(
        internal: Client, django_capture_on_commit_callbacks: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An idle engine claiming 100,000 LoRA and CPU slots is used as one of 2 and 6 (the fleet's ceilings): a pass
    pre-warms 6 versions there, not all 12 an operator wants on two nodes (before: all 12, each load handing it
    presigned URLs to another tenant's weights). The clamp is logged once, not on every heartbeat."""
    versions = _versions(12)
    for v in versions:
        VersionIntent.objects.create(adapter_version=v, min_replicas=2)
    honest, rogue = _register("honest"), _register("rogue")
    _beat(internal, honest, "honest")
    with caplog.at_level(logging.WARNING, logger="inference.fleet.nodes"):
        for _ in range(3):
            _beat(internal, rogue, "rogue", max_loras=100_000, max_cpu_loras=100_000, max_lora_rank=2**31 - 1)
    node = Node.objects.get(name="rogue")
    assert (node.max_loras, node.max_cpu_loras, node.max_lora_rank) == (2, 6, 16)  # rank: the base model's
    assert node.state["max_cpu_loras"] == 100_000  # what it claimed stays on record
    clamps = sorted((r.field, r.reported, r.ceiling) for r in caplog.records  # type: ignore[attr-defined]
                    if r.getMessage() == "node.capacity_clamped")
    assert clamps == [("max_cpu_loras", 100_000, 6), ("max_lora_rank", 2**31 - 1, 16), ("max_loras", 100_000, 2)]

    with django_capture_on_commit_callbacks():
        fleet_reconcile()

    warming = Placement.objects.filter(warming_since__isnull=False)
    assert warming.filter(node__name="rogue").count() == 6
    assert warming.filter(node__name="honest").count() == 4  # within what it reported (4 < 6)


def test_an_operators_ceiling_holds_at_once_and_below_the_fleets(internal: Client) -> None:
    """``--max-cpu-loras 3`` on a registered node applies to its last report at once, without a heartbeat; a report
    within the ceiling is used as reported."""
    token = _register("n1")
    _beat(internal, token, "n1", max_loras=4, max_cpu_loras=20)
    assert Node.objects.values_list("max_loras", "max_cpu_loras").get(name="n1") == (4, 20)
    _register("n1", max_cpu_loras=3, max_loras=2)
    assert Node.objects.values_list("max_loras", "max_cpu_loras", "max_cpu_loras_ceiling").get(name="n1") == (2, 3, 3)
    _beat(internal, token, "n1", max_loras=1, max_cpu_loras=20)
    assert Node.objects.values_list("max_loras", "max_cpu_loras").get(name="n1") == (1, 3)


def test_a_nodes_report_of_a_pin_no_operator_made_leaves_it_trimmable(internal: Client, monkeypatch: Any) -> None:
    """A node reporting pinned=True for a version no operator pinned does not mark its row: with ``max_replicas``
    1, the trim evicts that node's copy, off the plan (before: its row was pinned, so the honest node's copy was
    evicted instead and the rogue kept the only one). Where an operator pinned it, the engine's pin marks the row."""
    (version,) = _versions(1)
    intent = VersionIntent.objects.create(adapter_version=version, max_replicas=1)
    honest, rogue = _register("honest"), _register("rogue")
    for name in ("honest", "rogue"):
        placement_mark_load_issued(Node.objects.get(name=name).pk, version.pk)
    _beat(internal, honest, "honest", adapters=[_entry(version)])
    for _ in range(2):
        _beat(internal, rogue, "rogue", adapters=[_entry(version, "hot", pinned=True)])
    row = Placement.objects.get(node__name="rogue", adapter_version=version)
    assert (row.tier, row.pinned) == ("hot", False)

    evicted: list[int] = []
    monkeypatch.setattr("inference.fleet.reconcile._evict", evicted.extend)
    assert fleet_trim(plans={version.pk: ("honest",)}, intents={version.pk: intent}, counts={}) == 1
    assert evicted == [row.pk]

    VersionIntent.objects.filter(pk=intent.pk).update(pinned_nodes=["rogue"])
    _beat(internal, rogue, "rogue", adapters=[_entry(version, "hot", pinned=True)])
    assert Placement.objects.get(pk=row.pk).pinned


def test_a_load_answer_cannot_pin_what_was_not_asked_to_be_pinned(monkeypatch: Any) -> None:
    """The agent's answer to an unpinned load saying ``pinned`` does not mark the row."""
    (version,) = _versions(1)
    _register("n1")
    monkeypatch.setattr("inference.fleet.warming.node_call",
                        lambda *_a, **_k: {"tier": "hot", "pinned": True, "effect": "changed"})
    placement = placement_warm(version, node=Node.objects.get(name="n1"), pin=False)
    assert (placement.tier, placement.pinned) == ("hot", False)
    assert not Placement.objects.get(pk=placement.pk).pinned


def _command(*flags: str) -> Node:
    call_command("quiver_node_register", "n1", "--agent-url", "http://n1:8100", "--engine-url", "http://n1:8000",
                 "--base-model", "tiny-llama", *flags, stdout=io.StringIO(), stderr=io.StringIO())
    return Node.objects.get(name="n1")


@pytest.mark.parametrize(("flags", "named"), [
    (("--max-loras", "0"), "--max-loras"),
    (("--max-cpu-loras", "lots"), "--max-cpu-loras"),
    (("--max-lora-rank", "-16"), "--max-lora-rank"),
    (("--max-loras", str(2**31)), "--max-loras"),
    (("--max-loras", "4", "--max-cpu-loras", "2"), "--max-cpu-loras"),
    (("--max-loras", "64"), "--max-cpu-loras"),  # above the fleet's CPU ceiling (32): vLLM needs cpu >= loras
])
def test_bad_ceilings_are_refused_naming_the_flag(flags: tuple[str, ...], named: str) -> None:
    with pytest.raises(CommandError, match=named):
        _command(*flags)
    assert not Node.objects.filter(name="n1").exists()  # nothing of a refused registration is written


def test_the_register_command_stores_keeps_and_resets_ceilings() -> None:
    node = _command("--max-loras", "4", "--max-cpu-loras", "64", "--max-lora-rank", "32")
    assert (node.max_loras_ceiling, node.max_cpu_loras_ceiling, node.max_lora_rank_ceiling) == (4, 64, 32)
    node = _command("--rotate")  # omitted: kept
    assert (node.max_loras_ceiling, node.max_cpu_loras_ceiling, node.max_lora_rank_ceiling) == (4, 64, 32)
    node = _command("--max-cpu-loras", "default", "--max-lora-rank", "default")
    assert (node.max_loras_ceiling, node.max_cpu_loras_ceiling, node.max_lora_rank_ceiling) == (4, None, None)
