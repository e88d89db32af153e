"""Pin bounds hold under races: concurrent operator pins and the reconciler never pass ``max_loras − 1`` pins per node
nor a tenant's ``max_pinned`` (``inference.fleet.services``: row locks on the quota and the nodes); and a heartbeat's
report that may predate a load, a pin or an evict does not undo it (``inference.fleet.nodes.node_heartbeat``)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import Node, Placement, TenantResidencyQuota, VersionIntent
from inference.fleet.reconcile import fleet_reconcile
from inference.fleet.services import FleetActionError, node_pins, version_pin
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_tasks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr("inference.fleet.services.enqueue_on_commit", lambda name, *args: sent.append((name, args)))
    monkeypatch.setattr("inference.fleet.reconcile.placement_request_warm_enqueued",
                        lambda *a, **k: (None, False))
    return sent


def _node(name: str, base_model: Any, max_loras: int) -> Node:
    return Node.objects.create(name=name, base_model=base_model, agent_url="http://a", engine_url="http://e",
                               healthy=True, last_heartbeat_at=timezone.now(), max_loras=max_loras,
                               max_cpu_loras=max_loras * 2, max_lora_rank=16)


def _versions(slug: str, count: int) -> list[AdapterVersion]:
    tenant = TenantFactory(slug=slug)
    out = []
    for i in range(count):
        adapter = adapter_create(tenant, name=f"bot{i}", base_model_name="tiny-llama")
        out.append(AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=f"{i % 10}" * 64,
                                                 size_bytes=10, s3_prefix=f"{slug}{i}/", files=[], status="ready",
                                                 r=8))
    return out


def _race(versions: list[AdapterVersion], node: Node) -> Counter[str]:
    """Pin every version on ``node`` at once, one thread each, all released together; outcomes by code."""
    outcomes: Counter[str] = Counter()
    start = threading.Barrier(len(versions))
    lock = threading.Lock()

    def pin(version: AdapterVersion) -> None:
        try:
            start.wait()
            version_pin(version, node=node, actor="ops@test")
            outcome = "pinned"
        except FleetActionError as exc:
            outcome = exc.code
        finally:
            connection.close()
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=pin, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return outcomes


def _pinned_intents(node: Node) -> int:
    return sum(node.name in names for names in VersionIntent.objects.values_list("pinned_nodes", flat=True))


def test_twenty_concurrent_pins_at_one_four_slot_node_leave_three(base_model: Any) -> None:
    node = _node("n0", base_model, max_loras=4)
    versions = _versions("acme", 20)

    outcomes = _race(versions, node)

    assert outcomes == Counter({"pinned": 3, "pin_limit": 17})
    assert Placement.objects.filter(node=node, pinned=True).count() == 3
    assert _pinned_intents(node) == 3 and len(node_pins(node)) == 3


def test_twenty_concurrent_pins_of_one_tenant_keep_its_max_pinned(base_model: Any) -> None:
    node = _node("n0", base_model, max_loras=64)
    versions = _versions("acme", 20)
    TenantResidencyQuota.objects.create(tenant=versions[0].tenant, max_pinned=2)

    outcomes = _race(versions, node)

    assert outcomes == Counter({"pinned": 2, "residency_quota_exceeded": 18})
    assert _pinned_intents(node) == 2


def test_the_reconciler_carries_a_fleet_pin_only_where_the_node_has_room(base_model: Any) -> None:
    """Two fleet pins granted on a roomy node; both versions then show up on a two-slot node (a request loaded
    them there): the reconciler pins one of them there, not both (vLLM would then have no unpinned slot)."""
    roomy, small = _node("n0", base_model, max_loras=8), _node("n1", base_model, max_loras=2)
    first, second = _versions("acme", 2)
    for v in (first, second):
        Placement.objects.create(node=roomy, adapter_version=v, tier="warm", served=True)
        version_pin(v, node=None, actor="ops@test")
        Placement.objects.create(node=small, adapter_version=v, tier="warm", served=True)

    fleet_reconcile()
    fleet_reconcile()

    assert Placement.objects.filter(node=roomy, pinned=True).count() == 2
    assert Placement.objects.filter(node=small, pinned=True).count() == 1


def test_a_heartbeat_between_a_pin_and_its_warm_does_not_free_the_room(base_model: Any) -> None:
    """The engine has not pinned it yet and says so; the row keeps its mark while the intent stands, so a second pin
    on a two-slot node is still refused (and the mark goes once the operator unpins)."""
    from inference.fleet.nodes import node_heartbeat
    from inference.fleet.services import version_unpin

    node = _node("n0", base_model, max_loras=2)
    first, second = _versions("acme", 2)
    version_pin(first, node=node, actor="ops@test")
    Placement.objects.filter(node=node, adapter_version=first).update(load_issued_at=timezone.now())
    unpinned = {"lora_name": first.served_name, "lora_int_id": first.pk, "tier": "warm", "pinned": False,
                "served": True}

    node_heartbeat(node=node, state={"healthy": True, "max_loras": 2, "adapters": [unpinned]})

    assert Placement.objects.get(node=node, adapter_version=first).pinned
    with pytest.raises(FleetActionError) as refused:
        version_pin(second, node=node, actor="ops@test")
    assert refused.value.code == "pin_limit"
    version_unpin(first, node=node, actor="ops@test")
    node_heartbeat(node=node, state={"healthy": True, "max_loras": 2, "adapters": [unpinned]})
    assert not Placement.objects.get(node=node, adapter_version=first).pinned
    version_pin(second, node=node, actor="ops@test")


def _warm_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node answers every load at once: resident, pinned as asked."""
    monkeypatch.setattr("inference.fleet.warming.node_call",
                        lambda _node, path, payload: {"tier": "warm", "pinned": payload["pin"], "load_ms": 5.0})


def test_a_report_built_before_a_pinned_load_finished_leaves_the_row_pinned(
        base_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent built its report, then the pinned load finished and the warm marked the row; the report arrives after
    it and lists nothing. The row keeps what the warm wrote (the pin's room on a two-slot node stays taken); even
    where a report is taken as current, a pin naming the node keeps its mark on a copy the report omits."""
    from inference.fleet.nodes import node_heartbeat
    from inference.fleet.warming import placement_warm

    node = _node("n0", base_model, max_loras=2)
    first, second = _versions("acme", 2)
    version_pin(first, node=node, actor="ops@test")
    _warm_answered(monkeypatch)
    placement_warm(first, node=node, pin=True)

    node_heartbeat(node=node, state={"healthy": True, "max_loras": 2, "adapters": []})  # built before the load

    row = Placement.objects.get(node=node, adapter_version=first)
    assert (row.tier, row.pinned, row.served) == ("warm", True, True)
    with pytest.raises(FleetActionError) as refused:
        version_pin(second, node=node, actor="ops@test")
    assert refused.value.code == "pin_limit"
    node_heartbeat(node=node, state={"healthy": True, "max_loras": 2, "adapters": []})  # built after: it went
    row.refresh_from_db()
    assert (row.tier, row.pinned, row.served) == ("cold", True, False)
    with pytest.raises(FleetActionError):
        version_pin(second, node=node, actor="ops@test")


def test_a_report_older_than_a_load_does_not_undo_it_for_one_heartbeat(
        base_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No pin: a warm finishes between two heartbeats. The report that arrives next may predate it, so neither its
    silence nor its older word on the copy (staged, unpinned) undoes the load; the report after it, built once that
    heartbeat was recorded, does."""
    from inference.fleet.nodes import node_heartbeat
    from inference.fleet.warming import placement_warm

    node = _node("n0", base_model, max_loras=4)
    silent, staged = _versions("acme", 2)
    _warm_answered(monkeypatch)
    placement_warm(silent, node=node, pin=False)
    placement_warm(staged, node=node, pin=True)  # the node's own pin (no operator's intent)
    older = {"lora_name": staged.served_name, "lora_int_id": staged.pk, "tier": "staged", "pinned": False,
             "served": False}

    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": [older]})

    rows = dict(Placement.objects.filter(node=node).values_list("adapter_version_id", "tier"))
    assert rows == {silent.pk: "warm", staged.pk: "warm"}
    assert Placement.objects.get(node=node, adapter_version=staged).pinned
    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": [older]})
    assert list(Placement.objects.filter(node=node).order_by("adapter_version_id").values_list(
        "tier", "pinned", "served")) == [("cold", False, False), ("staged", False, False)]


def test_a_report_older_than_an_evict_does_not_bring_the_copy_back(
        base_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror image: an evict lands after the node's last heartbeat, and the next report, read before the engine
    dropped the copy, still lists it warm. The row stays out (a promotion would otherwise call it warm and skip the
    load); the report after that one is taken as it is."""
    from inference.fleet.nodes import node_heartbeat
    from inference.fleet.warming import placement_evict

    node = _node("n0", base_model, max_loras=4)
    (version,) = _versions("acme", 1)
    row = Placement.objects.create(node=node, adapter_version=version, tier="warm", served=True,
                                   load_issued_at=timezone.now())
    warm = {"lora_name": version.served_name, "lora_int_id": version.pk, "tier": "warm", "pinned": False,
            "served": True}
    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": [warm]})
    monkeypatch.setattr("inference.fleet.warming.node_call", lambda *a, **k: {})
    placement_evict(Placement.objects.select_related("node", "adapter_version").get(pk=row.pk))

    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": [warm]})  # read before the evict

    row.refresh_from_db()
    assert (row.tier, row.served) == ("staged", False)
    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": [warm]})  # a request reloaded it
    row.refresh_from_db()
    assert (row.tier, row.served) == ("warm", True)


def test_a_copy_the_node_no_longer_reports_loses_a_mark_no_named_pin_holds(base_model: Any) -> None:
    """Only a pin naming the node keeps the mark on a copy gone from the report: an engine-reported pin without an
    operator's intent (or a fleet pin, which covers only nodes that hold the version) goes with the copy."""
    from inference.fleet.nodes import node_heartbeat

    node = _node("n0", base_model, max_loras=4)
    engine_only, fleet = _versions("acme", 2)
    for v in (engine_only, fleet):
        Placement.objects.create(node=node, adapter_version=v, tier="warm", served=True, pinned=True,
                                 load_issued_at=timezone.now())
    VersionIntent.objects.create(adapter_version=fleet, pinned_fleet=True)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now())  # a heartbeat recorded since the loads
    node.refresh_from_db()

    node_heartbeat(node=node, state={"healthy": True, "max_loras": 4, "adapters": []})

    assert list(Placement.objects.filter(node=node).values_list("tier", "pinned", "served").distinct()) == [
        ("cold", False, False)]
