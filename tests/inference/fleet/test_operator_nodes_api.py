"""Operator node API: staff register a node (credentials shown once), rotate them, deregister it; everyone else
is refused, and a revoked credential can never heartbeat again."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from inference.fleet.models import FleetAuditRecord, Node, Placement
from inference.fleet.nodes import NodeRefused, node_heartbeat_accept

pytestmark = pytest.mark.django_db
NODE = {"name": "gpu-7", "agent_url": "http://gpu-7:8100", "engine_url": "http://gpu-7:8000", "base_model": "tiny-llama"}


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="op", password="x", is_staff=True))
    return client


def _beat(token: str, name: str = "gpu-7") -> Node:
    return node_heartbeat_accept(token=token, body={"node": name, "healthy": True, "max_loras": 2,
                                                    "max_cpu_loras": 4, "max_lora_rank": 16, "adapters": []})


def test_register_rotate_deregister(staff: APIClient, base_model: Any) -> None:
    created = staff.post("/api/v1/operator/nodes", NODE, format="json")
    assert created.status_code == 201, created.content
    creds = created.json()["credentials"]
    assert creds["QUIVER_NODE_NAME"] == "gpu-7" and creds["QUIVER_NODE_TOKEN"].startswith("qvn_gpu-7.")
    assert _beat(creds["QUIVER_NODE_TOKEN"]).healthy
    # Shown once: reading the node never shows a credential, and registering the name again is refused.
    listed = staff.get("/api/v1/operator/nodes/gpu-7")
    assert listed.status_code == 200 and creds["QUIVER_NODE_KEY"] not in listed.content.decode()
    again = staff.post("/api/v1/operator/nodes", {**NODE, "agent_url": "http://evil:1"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "node_exists"
    assert Node.objects.get(name="gpu-7").agent_url == "http://gpu-7:8100"

    rotated = staff.post("/api/v1/operator/nodes/gpu-7/rotate")
    assert rotated.status_code == 200 and rotated.json()["key_generation"] == 2
    new = rotated.json()["credentials"]
    assert new["QUIVER_NODE_TOKEN"] != creds["QUIVER_NODE_TOKEN"] and new["QUIVER_NODE_KEY"] != creds["QUIVER_NODE_KEY"]
    with pytest.raises(NodeRefused):
        _beat(creds["QUIVER_NODE_TOKEN"])
    _beat(new["QUIVER_NODE_TOKEN"])

    node = Node.objects.get(name="gpu-7")
    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_create
    from tests.factories import TenantFactory

    tenant = TenantFactory()
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter_create(tenant, name="a", base_model_name="tiny-llama"),
                                            number=1, sha256="0" * 64, size_bytes=1, s3_prefix="x/", files=[], status="ready")
    Placement.objects.create(node=node, adapter_version=version, tier="hot")
    assert staff.delete("/api/v1/operator/nodes/gpu-7").status_code == 204
    node.refresh_from_db()
    assert not node.healthy and node.deregistered_at is not None and not Placement.objects.filter(node=node).exists()
    assert [n["name"] for n in staff.get("/api/v1/operator/nodes").json()["results"]] == []
    assert staff.get("/api/v1/operator/nodes/gpu-7").status_code == 404
    assert staff.delete("/api/v1/operator/nodes/gpu-7").status_code == 404
    with pytest.raises(NodeRefused):
        _beat(new["QUIVER_NODE_TOKEN"])
    # Registering the name again never revives an old credential.
    back = staff.post("/api/v1/operator/nodes", NODE, format="json")
    assert back.status_code == 201 and back.json()["key_generation"] == 4
    for old in (creds, new):
        with pytest.raises(NodeRefused):
            _beat(old["QUIVER_NODE_TOKEN"])
    assert list(FleetAuditRecord.objects.order_by("id").values_list("action", flat=True)) == [
        "node_register", "node_rotate", "node_deregister", "node_register"]
    assert creds["QUIVER_NODE_KEY"] not in str(list(FleetAuditRecord.objects.values("before", "after")))


def test_bad_registrations_name_the_field(staff: APIClient, base_model: Any) -> None:
    bad = staff.post("/api/v1/operator/nodes", {**NODE, "name": "GPU_7"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid" and "GPU_7" in bad.json()["detail"]
    bad = staff.post("/api/v1/operator/nodes", {**NODE, "engine_url": "file:///etc/passwd"}, format="json")
    assert bad.status_code == 400 and "engine_url" in bad.json()["detail"]
    bad = staff.post("/api/v1/operator/nodes", {**NODE, "base_model": "nope"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "base_model_not_found"
    missing = staff.post("/api/v1/operator/nodes", {"name": "x"}, format="json")
    assert missing.status_code == 400 and "agent_url" in missing.json()["fields"]
    assert staff.post("/api/v1/operator/nodes/nope/rotate").status_code == 404
    assert not Node.objects.exists()


def test_non_staff_cannot_register_rotate_or_deregister(make_client: Any, make_session_client: Any,
                                                        staff: APIClient, base_model: Any) -> None:
    staff.post("/api/v1/operator/nodes", NODE, format="json")
    key_client, _, _ = make_client()
    owner, _, _ = make_session_client(role="owner")
    for client, status in ((key_client, 403), (owner, 403), (APIClient(), 401)):
        assert client.post("/api/v1/operator/nodes", {**NODE, "name": "gpu-8"}, format="json").status_code == status
        assert client.post("/api/v1/operator/nodes/gpu-7/rotate").status_code == status
        assert client.delete("/api/v1/operator/nodes/gpu-7").status_code == status
        assert client.get("/api/v1/operator/nodes/gpu-7").status_code == status
    node = Node.objects.get(name="gpu-7")
    assert node.key_generation == 1 and node.deregistered_at is None and not Node.objects.filter(name="gpu-8").exists()


def test_ceilings_are_set_at_registration_and_the_view_shows_reported_and_used(staff: APIClient,
                                                                               base_model: Any) -> None:
    """The register body may set the node's capacity ceilings (a bad one is a 400 naming the field); the node view
    shows what the node claimed (``reported``), the ``ceilings`` and the figures used (``max_loras`` ...)."""
    bad = staff.post("/api/v1/operator/nodes", {**NODE, "max_cpu_loras": 0}, format="json")
    assert bad.status_code == 400 and "max_cpu_loras" in bad.json()["detail"]
    bad = staff.post("/api/v1/operator/nodes", {**NODE, "max_loras": 8, "max_cpu_loras": 4}, format="json")
    assert bad.status_code == 400 and "max_cpu_loras" in bad.json()["detail"], bad.json()
    assert not Node.objects.filter(name="gpu-7").exists()
    created = staff.post("/api/v1/operator/nodes", {**NODE, "max_loras": 2, "max_cpu_loras": 3}, format="json")
    assert created.status_code == 201, created.json()
    node_heartbeat_accept(token=created.json()["credentials"]["QUIVER_NODE_TOKEN"], body={
        "node": "gpu-7", "healthy": True, "max_loras": 100, "max_cpu_loras": 100_000, "max_lora_rank": 16,
        "adapters": []})
    view = staff.get("/api/v1/operator/nodes/gpu-7").json()
    assert view["reported"] == {"max_loras": 100, "max_cpu_loras": 100_000, "max_lora_rank": 16}
    assert view["ceilings"] == {"max_loras": 2, "max_cpu_loras": 3, "max_lora_rank": 16}  # the rank: the base model's
    assert (view["max_loras"], view["max_cpu_loras"], view["max_lora_rank"]) == (2, 3, 16)
