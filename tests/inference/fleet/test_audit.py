"""Every fleet audit action is written with what actually happened: the intent as saved (pin, unpin, set_replicas,
set_residency_quota, set_limits) and, for evict, the node's outcome once it answered (pending until then)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet import tasks as fleet_tasks
from inference.fleet.models import FleetAuditRecord, Node, Placement
from inference.fleet.node_client import NodeCallFailed
from inference.fleet.services import (
    placement_evict_now,
    tenant_limits_set,
    tenant_residency_quota_set,
    version_pin,
    version_replicas_set,
    version_unpin,
)
from tests.factories import TenantFactory
from tests.fixtures.bus import bus_listener

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(base_model: Any) -> dict[str, Any]:
    tenant = TenantFactory(slug="acme")
    node = Node.objects.create(name="n0", base_model=base_model, agent_url="http://a", engine_url="http://e",
                               healthy=True, last_heartbeat_at=timezone.now(), max_loras=4, max_cpu_loras=8)
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="a" * 64, size_bytes=10,
                                            s3_prefix="x/", files=[], status="ready", r=8)
    return {"tenant": tenant, "node": node, "version": version}


def _rows() -> list[tuple[str, str, str, dict[str, Any], dict[str, Any]]]:
    return list(FleetAuditRecord.objects.order_by("id").values_list("actor", "action", "target", "before", "after"))


def test_intent_actions_record_the_saved_state(fleet: dict[str, Any],
                                                django_capture_on_commit_callbacks: Any) -> None:
    v, node, tenant = fleet["version"], fleet["node"], fleet["tenant"]
    intent = {"min_replicas": 1, "max_replicas": None, "pinned_fleet": False, "pinned_nodes": []}
    with django_capture_on_commit_callbacks():
        version_pin(v, node=node, actor="ops")
        version_unpin(v, node=node, actor="ops")
        version_replicas_set(v, min_replicas=2, max_replicas=3, actor="ops")
        tenant_residency_quota_set(tenant, max_pinned=1, max_gpu_bytes=4096, actor="ops")
        tenant_limits_set(tenant, limits={"rpm_limit": 60}, actor="ops")

    rows = _rows()
    assert [r[:3] for r in rows] == [("ops", "pin", "acme/bot@1"), ("ops", "unpin", "acme/bot@1"),
                                     ("ops", "set_replicas", "acme/bot@1"), ("ops", "set_residency_quota", "acme"),
                                     ("ops", "set_limits", "acme")]
    assert rows[0][3:] == (intent, {**intent, "pinned_nodes": ["n0"]})
    assert rows[1][3:] == ({**intent, "pinned_nodes": ["n0"]}, intent)
    assert rows[2][3:] == (intent, {**intent, "min_replicas": 2, "max_replicas": 3})
    assert rows[3][3:] == ({"max_pinned": None, "max_gpu_bytes": None}, {"max_pinned": 1, "max_gpu_bytes": 4096})
    assert rows[4][3]["rpm_limit"] is None and rows[4][4]["rpm_limit"] == 60


def test_saving_unchanged_values_writes_no_audit_row(fleet: dict[str, Any],
                                                   django_capture_on_commit_callbacks: Any) -> None:
    """Before: each save wrote a row, so saving a quota or limits form untouched left rows whose before == after."""
    v, node, tenant = fleet["version"], fleet["node"], fleet["tenant"]
    with django_capture_on_commit_callbacks():
        for _ in range(2):
            version_pin(v, node=node, actor="ops")
            version_replicas_set(v, min_replicas=2, max_replicas=3, actor="ops")
            tenant_residency_quota_set(tenant, max_pinned=1, max_gpu_bytes=4096, actor="ops")
            tenant_limits_set(tenant, limits={"rpm_limit": 60}, actor="ops")
        tenant_limits_set(tenant, limits={"rpm_limit": 60, "tpm_limit": None}, actor="ops")
    rows = _rows()
    assert [r[1] for r in rows] == ["pin", "set_replicas", "set_residency_quota", "set_limits"]
    assert all(r[3] != r[4] for r in rows)


@pytest.mark.parametrize("node_answer", ["ok", "refused"])
def test_evict_is_pending_until_the_node_answers_then_records_its_outcome(
        fleet: dict[str, Any], django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch,
        node_answer: str) -> None:
    placement = Placement.objects.create(node=fleet["node"], adapter_version=fleet["version"], tier="hot",
                                         served=True)

    def node_call(node: Node, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if node_answer == "refused":
            raise NodeCallFailed("engine_unavailable", "the engine is restarting")
        return {"lora_name": body["lora_name"], "tier": "staged"}

    monkeypatch.setattr("inference.fleet.warming.node_call", node_call)
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(fleet_tasks.placement_evict_task, "delay", lambda *args: sent.append(args))
    with django_capture_on_commit_callbacks(execute=True):
        record = placement_evict_now(placement, actor="ops")
    assert _rows() == [("ops", "evict", "acme/bot@1", {"node": "n0", "tier": "hot"}, {"outcome": "pending"})]
    assert sent == [(placement.pk, record.pk)]

    if node_answer == "ok":
        with bus_listener() as drain:  # every gateway re-reads now, not at its next refresh (propagation_ms)
            with django_capture_on_commit_callbacks(execute=True):
                fleet_tasks.placement_evict_task(*sent[0])
            assert drain() == [("placements", None)]
        after = {"node": "n0", "tier": "staged", "served": False, "outcome": "evicted"}
    else:
        with pytest.raises(NodeCallFailed):
            fleet_tasks.placement_evict_task(*sent[0])
        after = {"node": "n0", "tier": "hot", "outcome": "failed", "error": "engine_unavailable",
                 "detail": "the engine is restarting"}
    assert _rows() == [("ops", "evict", "acme/bot@1", {"node": "n0", "tier": "hot"}, after)]


def test_an_evict_whose_placement_went_away_says_so(fleet: dict[str, Any]) -> None:
    placement = Placement.objects.create(node=fleet["node"], adapter_version=fleet["version"], tier="warm")
    record = placement_evict_now(placement, actor="ops")
    placement.delete()

    fleet_tasks.placement_evict_task(placement.pk, record.pk)

    assert FleetAuditRecord.objects.get(pk=record.pk).after == {"outcome": "gone"}
