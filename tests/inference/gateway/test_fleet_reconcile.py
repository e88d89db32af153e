"""The reconcile loop converges toward the plan and operators' intent, and is idempotent."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.gateway.fleet_reconcile import fleet_reconcile
from inference.gateway.models import Node, Placement, VersionIntent
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


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


def test_idle_version_gets_one_replica_and_a_pin_is_carried_out(setup: dict[str, Any],
                                                              django_capture_on_commit_callbacks: Any) -> None:
    version = setup["version"]
    with django_capture_on_commit_callbacks() as callbacks:
        assert fleet_reconcile() == 1
    assert len(callbacks) == 1
    Placement.objects.all().delete()
    VersionIntent.objects.create(adapter_version=version, pinned_nodes=["n1"])
    with django_capture_on_commit_callbacks():
        fleet_reconcile()
    pinned = Placement.objects.get(adapter_version=version, node__name="n1")
    assert pinned.pinned and pinned.warming_since is not None
