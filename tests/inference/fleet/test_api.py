"""Operator fleet actions (pin/unpin, evict now, replicas, residency quotas) with audit records; tenant residency."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import FleetAuditRecord, Node, Placement, VersionIntent
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def op() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="ops-anna", password="x", is_staff=True))
    return client


def _version(tenant: Any, name: str) -> AdapterVersion:
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    return AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=name[0] * 64,
                                         size_bytes=2048, s3_prefix="x/", files=[], status="ready")


@pytest.fixture
def fleet(base_model: Any) -> dict[str, Any]:
    Node.objects.all().delete()
    tenant = TenantFactory(slug="acme")
    node = Node.objects.create(name="gpu-1", base_model=base_model, agent_url="http://a", engine_url="http://e",
                               healthy=True, max_loras=3, max_cpu_loras=8)
    versions = [_version(tenant, n) for n in ("alpha", "beta", "gamma")]
    return {"tenant": tenant, "node": node, "versions": versions}


def test_pin_writes_intent_audit_and_enqueues_a_pinned_warm(op: APIClient, fleet: dict[str, Any],
                                                             django_capture_on_commit_callbacks: Any) -> None:
    v = fleet["versions"][0]
    with django_capture_on_commit_callbacks() as callbacks:
        r = op.post(f"/api/v1/operator/versions/{v.pk}/pin", {"node": "gpu-1"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["pinned_nodes"] == ["gpu-1"]
    assert len(callbacks) == 1  # the warm task, carrying pin=True through the placement row
    assert Placement.objects.get(adapter_version=v, node=fleet["node"]).pinned
    [audit] = FleetAuditRecord.objects.all()
    assert (audit.actor, audit.action, audit.target) == ("ops-anna", "pin", "acme/alpha@1")
    assert audit.before["pinned_nodes"] == [] and audit.after["pinned_nodes"] == ["gpu-1"]


def test_pins_bounded_at_slots_minus_one(op: APIClient, fleet: dict[str, Any]) -> None:
    a, b, c = fleet["versions"]
    for v in (a, b):
        assert op.post(f"/api/v1/operator/versions/{v.pk}/pin", {"node": "gpu-1"}, format="json").status_code == 200
    third = op.post(f"/api/v1/operator/versions/{c.pk}/pin", {"node": "gpu-1"}, format="json")
    assert (third.status_code, third.json()["code"]) == (409, "pin_limit")
    assert "at most 2" in third.json()["detail"]


def test_tenant_pin_quota_is_enforced(op: APIClient, fleet: dict[str, Any]) -> None:
    a, b, _ = fleet["versions"]
    assert op.put("/api/v1/operator/residency-quotas/acme", {"max_pinned": 1}, format="json").status_code == 200
    assert op.get("/api/v1/operator/residency-quotas/acme").json() == {"max_pinned": 1, "max_gpu_bytes": None}
    assert op.post(f"/api/v1/operator/versions/{a.pk}/pin", {"node": "gpu-1"}, format="json").status_code == 200
    over = op.post(f"/api/v1/operator/versions/{b.pk}/pin", {"node": "gpu-1"}, format="json")
    assert (over.status_code, over.json()["code"]) == (409, "residency_quota_exceeded")
    # A sentence naming the tenant, the quota (singular), what is pinned now and both fixes; it was "tenant may pin
    # 1 versions; unpin one or raise the quota".
    assert over.json()["detail"] == (
        "Tenant 'acme' may pin 1 version and already pins 1 (acme/alpha@1), so acme/beta@1 cannot be pinned too: "
        "unpin one of them, or raise the tenant's max_pinned (PUT /api/v1/operator/residency-quotas/acme).")
    actions = list(FleetAuditRecord.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["set_residency_quota", "pin"]


def test_a_zero_pin_quota_says_versions_in_the_plural_and_that_nothing_is_pinned(op: APIClient,
                                                                                 fleet: dict[str, Any]) -> None:
    a = fleet["versions"][0]
    assert op.put("/api/v1/operator/residency-quotas/acme", {"max_pinned": 0}, format="json").status_code == 200
    over = op.post(f"/api/v1/operator/versions/{a.pk}/pin", {"node": "gpu-1"}, format="json")
    assert over.status_code == 409
    assert over.json()["detail"].startswith("Tenant 'acme' may pin 0 versions and pins none now, so acme/alpha@1")


def test_unpin_evicts_and_replicas_validate(op: APIClient, fleet: dict[str, Any],
                                            django_capture_on_commit_callbacks: Any) -> None:
    v = fleet["versions"][0]
    op.post(f"/api/v1/operator/versions/{v.pk}/pin", {"node": "gpu-1"}, format="json")
    with django_capture_on_commit_callbacks() as callbacks:
        r = op.post(f"/api/v1/operator/versions/{v.pk}/unpin", {"node": "gpu-1"}, format="json")
    assert r.status_code == 200 and r.json()["pinned_nodes"] == [] and len(callbacks) == 1
    bad = op.put(f"/api/v1/operator/versions/{v.pk}/replicas", {"min_replicas": 3, "max_replicas": 2}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_replicas")
    ok = op.put(f"/api/v1/operator/versions/{v.pk}/replicas", {"min_replicas": 2, "max_replicas": 3}, format="json")
    assert ok.status_code == 200
    assert VersionIntent.objects.get(adapter_version=v).min_replicas == 2


def test_evict_now_refuses_pinned_and_enqueues(op: APIClient, fleet: dict[str, Any],
                                               django_capture_on_commit_callbacks: Any) -> None:
    v = fleet["versions"][0]
    p = Placement.objects.create(node=fleet["node"], adapter_version=v, tier="hot", pinned=True)
    refused = op.post(f"/api/v1/operator/placements/{p.pk}/evict")
    assert (refused.status_code, refused.json()["code"]) == (409, "pinned")
    Placement.objects.filter(pk=p.pk).update(pinned=False)
    with django_capture_on_commit_callbacks() as callbacks:
        assert op.post(f"/api/v1/operator/placements/{p.pk}/evict").status_code == 202
    assert len(callbacks) == 1
    latest = op.get("/api/v1/operator/audit").json()[0]
    # Written with no assumed outcome: the task fills it in once the node answered (tests/inference/fleet/test_audit)
    assert (latest["action"], latest["after"]) == ("evict", {"outcome": "pending"})


def test_tenants_read_counts_only_and_cannot_act(fleet: dict[str, Any], make_client: Any) -> None:
    v = fleet["versions"][0]
    Placement.objects.create(node=fleet["node"], adapter_version=v, tier="hot")
    key_client, other_tenant, _ = make_client(slug="other")
    assert key_client.get("/api/v1/residency").json() == []  # another tenant's placements are invisible
    assert key_client.post(f"/api/v1/operator/versions/{v.pk}/pin", {}, format="json").status_code == 403
    owner, tenant, _ = make_client(slug="acme2")
    mine = _version(tenant, "delta")
    Placement.objects.create(node=fleet["node"], adapter_version=mine, tier="warm", pinned=True)
    [row] = owner.get("/api/v1/residency").json()
    assert row == {"adapter": "delta", "version": 1, "pinned": 1,
                   "tiers": {"cold": 0, "staged": 0, "warm": 1, "hot": 0, "errored": 0}}
    assert "gpu-1" not in str(row)


def test_a_key_limited_to_some_adapters_sees_only_their_residency(fleet: dict[str, Any], make_client: Any) -> None:
    """A key limited to ``delta`` learns nothing of the tenant's other adapters from ``/residency`` (a fresh user's
    finding: it listed every adapter's tiers), as every other route answers it."""
    _, tenant, _ = make_client(slug="acme3")
    for name in ("delta", "gamma"):
        Placement.objects.create(node=fleet["node"], adapter_version=_version(tenant, name), tier="warm")
    _, limited = api_key_create(tenant, name="bot", scopes=["inference", "adapters:read"], adapters=["delta"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {limited}")
    assert [row["adapter"] for row in client.get("/api/v1/residency").json()] == ["delta"]
    _, unlimited = api_key_create(tenant, name="all", scopes=["adapters:read"])
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {unlimited}")
    assert [row["adapter"] for row in client.get("/api/v1/residency").json()] == ["delta", "gamma"]


def test_schema_lists_the_fleet_routes(op: APIClient) -> None:
    paths = op.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()["paths"]
    for route in ("/api/v1/operator/versions/{id}/pin", "/api/v1/operator/placements/{id}/evict",
                  "/api/v1/operator/residency-quotas/{slug}", "/api/v1/operator/audit", "/api/v1/residency"):
        assert route in paths, route
