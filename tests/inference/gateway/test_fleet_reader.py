"""A gateway process's fleet view read from changes (``inference.gateway.fleet_reader``) misses no write: every
write path (``save``, ``QuerySet.update``, ``bulk_update``, raw SQL), rows going cold, deleted placements, nodes and
versions, nodes going unhealthy or stale, and a transaction that commits after a newer one with an older
``updated_at``. After each change the view equals a fresh full read's. On PostgreSQL (the triggers of
``fleet.0003``)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create, adapter_delete
from inference.fleet.models import GONE_KEEP_S, FleetGone, Node, Placement
from inference.fleet.nodes import node_deregister, node_register
from inference.gateway.directory import Directory
from inference.gateway.fleet_reader import FULL_EVERY_S, FleetReader
from inference.gateway.snapshot import FleetView
from tests.factories import TenantFactory


def _same_as_full(view: FleetView) -> bool:
    """Whether ``view`` equals what a fresh reader's full read gives now (placements in any order)."""
    full = FleetReader().load()
    return view.nodes == full.nodes and {v: frozenset(p) for v, p in view.placements.items()} == {
        v: frozenset(p) for v, p in full.placements.items()}


def _tiers(view: FleetView, version: AdapterVersion) -> dict[str, str]:
    names = {n.pk: n.name for n in view.nodes}
    return {names[p.node_id]: p.tier for p in view.placements.get(version.pk, ())}


@pytest.fixture
def fleet(base_model: Any) -> dict[str, Any]:
    nodes = [Node.objects.create(name=f"n{i}", base_model=base_model, agent_url=f"http://a{i}",
                                 engine_url=f"http://e{i}", healthy=True, last_heartbeat_at=timezone.now(),
                                 max_loras=4, max_cpu_loras=8, max_lora_rank=16, state={"residency": {"gpu": 1}})
             for i in range(3)]
    tenant = TenantFactory(slug="acme")
    versions = []
    for i in range(3):
        adapter = adapter_create(tenant, name=f"bot{i}", base_model_name="tiny-llama")
        versions.append(AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=f"{i}" * 64,
                                                      size_bytes=10, s3_prefix=f"x{i}/", files=[], status="ready",
                                                      r=8))
    for node in nodes:
        for version in versions:
            Placement.objects.create(node=node, adapter_version=version, tier="warm", served=True)
    return {"nodes": nodes, "versions": versions, "tenant": tenant}


@pytest.mark.django_db
def test_every_write_path_and_every_way_out_of_the_view_is_read(fleet: dict[str, Any], settings: Any) -> None:
    n0, n1, n2 = fleet["nodes"]
    v0, v1, v2 = fleet["versions"]
    reader = FleetReader()
    assert _tiers(reader.load(), v0) == {"n0": "warm", "n1": "warm", "n2": "warm"} and reader.last_read == "full"

    def read() -> FleetView:
        view = reader.load()
        assert reader.last_read == "changes"
        assert _same_as_full(view)
        return view

    Placement.objects.filter(node=n0, adapter_version=v0).update(tier="hot")  # no updated_at: not a save()
    assert _tiers(read(), v0)["n0"] == "hot"
    Placement.objects.filter(node=n1, adapter_version=v0).update(tier="cold", served=False)  # goes cold
    assert "n1" not in _tiers(read(), v0)
    rows = list(Placement.objects.filter(adapter_version=v1))
    for row in rows:
        row.tier = "errored"
        row.last_error = "load_failed: boom"
    Placement.objects.bulk_update(rows, ["tier", "last_error"])
    view = read()
    assert {p.error_code for p in view.placements[v1.pk]} == {"load_failed"}
    with connection.cursor() as cursor:
        cursor.execute("UPDATE gateway_placement SET tier = 'staged' WHERE node_id = %s AND adapter_version_id = %s",
                       [n2.pk, v2.pk])
    assert _tiers(read(), v2)["n2"] == "staged"
    Placement.objects.filter(node=n1, adapter_version=v0).update(tier="warm", served=True)  # back from cold
    assert _tiers(read(), v0)["n1"] == "warm"

    Node.objects.filter(pk=n2.pk).update(healthy=False)
    view = read()
    assert [n.name for n in view.nodes] == ["n0", "n1"] and "n2" not in _tiers(view, v0)
    Node.objects.filter(pk=n2.pk).update(healthy=True)  # its rows come back, though none was written
    assert _tiers(read(), v0)["n2"] == "warm"
    Node.objects.filter(pk=n1.pk).update(num_requests_waiting=7)
    assert next(n for n in read().nodes if n.name == "n1").num_requests_waiting == 7

    # A node whose heartbeats stop leaves by time alone, with no write.
    Node.objects.filter(pk=n2.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=60))
    read()
    settings.QUIVER_NODE_STALE_AFTER_S = 30
    assert "n2" not in {n.name for n in read().nodes}

    # Deregistered: its placement rows are deleted; registered and healthy again, none comes back.
    node_deregister(n1)
    assert "n1" not in _tiers(read(), v0)
    node_register(name="n1", agent_url="http://a1", engine_url="http://e1", base_model_name="tiny-llama")
    Node.objects.filter(pk=n1.pk).update(healthy=True, last_heartbeat_at=timezone.now())
    view = read()
    assert "n1" in {n.name for n in view.nodes} and all(p.node_id != n1.pk for ps in view.placements.values()
                                                        for p in ps)
    # A deleted adapter's version leaves with its placements; a deleted node with its own.
    adapter_delete(fleet["tenant"], adapter=v2.adapter)
    assert v2.pk not in read().placements
    Node.objects.filter(pk=n0.pk).delete()
    view = read()
    assert [n.name for n in view.nodes] == ["n1"] and view.placements == {}


@pytest.mark.django_db(transaction=True)
def test_a_transaction_committing_after_a_newer_one_with_an_older_updated_at_is_read(fleet: dict[str, Any]) -> None:
    n0, n1, n2 = fleet["nodes"]
    v0, v1, _ = fleet["versions"]
    reader = FleetReader()
    reader.load()
    reader.load()
    written, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def late() -> None:
        try:
            with transaction.atomic():
                Placement.objects.filter(node=n0, adapter_version=v0).update(
                    tier="hot", updated_at=timezone.now() - timedelta(hours=1))
                Placement.objects.filter(node=n1, adapter_version=v0).delete()
                written.set()
                assert release.wait(30)
        except BaseException as exc:  # surfaced by the main thread's assertion below
            failed.append(exc)
            written.set()
        finally:
            connection.close()

    thread = threading.Thread(target=late)
    thread.start()
    try:
        assert written.wait(30)
        # A newer transaction commits first (its id is above the late one's).
        Placement.objects.filter(node=n2, adapter_version=v1).update(tier="hot")
        for _ in range(2):  # read twice: the late rows are still awaited after a read that did not see them
            view = reader.load()
            assert _tiers(view, v1)["n2"] == "hot"
            assert _tiers(view, v0) == {"n0": "warm", "n1": "warm", "n2": "warm"}
    finally:
        release.set()
        thread.join(30)
    assert not failed and not thread.is_alive()
    view = reader.load()
    assert reader.last_read == "changes"
    assert _tiers(view, v0) == {"n0": "hot", "n2": "warm"}
    assert _same_as_full(view)
    # Nothing running any more: the next change read reads nothing, and so does the one after it.
    reader.load()
    reader.load()
    assert reader.rows_read == 0


@pytest.mark.django_db
def test_change_reads_read_what_changed_and_full_reads_come_at_start_after_reset_and_periodically(
        fleet: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    directory = Directory()
    reader = directory.fleet_reader
    reader.load()
    assert reader.last_read == "full" and reader.rows_read == 3 + 9
    reader.load()
    assert reader.last_read == "changes"
    directory.invalidate("fleet")  # a fresh view, from the changes
    reader.load()
    assert reader.last_read == "changes"
    clock = [1_000.0]
    monkeypatch.setattr("inference.gateway.fleet_reader.time.monotonic", lambda: clock[0])
    directory.invalidate("all")  # the bus's reset: start over
    reader.load()
    assert reader.last_read == "full"
    # A reset that lands while a read is in progress (the bus runs on another thread) is not lost to it.
    real_apply = reader._mirror.apply

    def apply_while_reset(**kwargs: Any) -> FleetView:
        reader.reset()
        return real_apply(**kwargs)

    monkeypatch.setattr(reader._mirror, "apply", apply_while_reset)
    reader.load()
    monkeypatch.setattr(reader._mirror, "apply", real_apply)
    reader.load()
    assert reader.last_read == "full"
    clock[0] += FULL_EVERY_S - 1
    reader.load()
    assert reader.last_read == "changes"
    clock[0] += 1
    reader.load()
    assert reader.last_read == "full"
    # A FleetGone record outlives the longest gap between two change reads many times over.
    assert FULL_EVERY_S * 5 <= GONE_KEEP_S


@pytest.mark.django_db
def test_triggers_stamp_every_write_and_record_and_prune_deletions(fleet: dict[str, Any]) -> None:
    n0 = fleet["nodes"][0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        xid = cursor.fetchone()[0]
    placement = Placement.objects.filter(node=n0).first()
    assert placement is not None
    Placement.objects.filter(pk=placement.pk).update(change_xid=1)  # whatever a writer says, the trigger stamps
    assert Placement.objects.get(pk=placement.pk).change_xid == xid
    assert Node.objects.get(pk=n0.pk).change_xid == xid
    FleetGone.objects.create(kind="placement", row_id=-1, change_xid=1,
                             at=timezone.now() - timedelta(seconds=GONE_KEEP_S + 60))
    kept = FleetGone.objects.create(kind="placement", row_id=-2, change_xid=1, at=timezone.now())
    pk = placement.pk
    placement.delete()  # recorded; the old record pruned, the recent one kept
    assert set(FleetGone.objects.values_list("kind", "row_id", "change_xid")) == {
        ("placement", pk, xid), ("placement", kept.row_id, 1)}
