"""``GET /api/v1/operator/nodes`` and ``…/residency``: staff sessions see every node and placement; tenants get 403."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import Node, Placement
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_staff_see_nodes_with_gauges_and_placements(base_model: Any) -> None:
    tenant = TenantFactory(slug="acme")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64,
                                            size_bytes=2048, s3_prefix="x/", files=[], status="ready")
    node = Node.objects.create(name="gpu-1", base_model=base_model, agent_url="http://a", engine_url="http://e",
                               healthy=True, max_loras=2, max_cpu_loras=4, kv_cache_usage_perc=0.42)
    Placement.objects.create(node=node, adapter_version=version, tier="hot", pinned=True)
    client = APIClient()
    client.force_login(User.objects.create_user(username="op", password="x", is_staff=True))
    [row] = client.get("/api/v1/operator/nodes").json()["results"]
    assert row["name"] == "gpu-1" and row["kv_cache_usage_perc"] == 0.42 and row["base_model"] == "tiny-llama"
    assert row["tiers"] == {"cold": 0, "staged": 0, "warm": 0, "hot": 1, "errored": 0} and row["pinned"] == 1
    assert "placements" not in row
    placement = Placement.objects.get()
    [cell_row] = client.get("/api/v1/operator/residency").json()["results"]
    assert cell_row == {"version_id": version.pk, "tenant": "acme", "adapter": "bot", "version": 1, "size_bytes": 2048,
                        "placements": [{"id": placement.pk, "node": "gpu-1", "tier": "hot", "pinned": True,
                                        "served": False, "load_ms": None, "last_error": "",
                                        "updated_at": cell_row["placements"][0]["updated_at"]}]}
    # The tenant's own view counts replicas per tier, never naming the node.
    owner = APIClient()
    owner.force_login(User.objects.create_user(username="o", password="x"))
    from tenants.services import membership_create

    membership_create(tenant, user=User.objects.get(username="o"), role="viewer")
    listed = owner.get("/api/v1/adapters").json()
    assert listed[0]["residency"] == {"hot": 1} and listed[0]["serving_version"] == 1
    assert "gpu-1" not in str(listed)


def test_tenants_and_anonymous_callers_are_refused(make_client: Any, make_session_client: Any) -> None:
    key_client, _, _ = make_client()
    session_client, _, _ = make_session_client(role="owner")
    for client in (key_client, session_client):  # the residency map names every tenant's versions and nodes
        refused = client.get("/api/v1/operator/residency")
        assert refused.status_code == 403 and refused.json()["code"] == "staff_required"
    by_key = key_client.get("/api/v1/operator/nodes")
    assert by_key.status_code == 403 and by_key.json()["code"] == "staff_required"
    assert "API keys cannot call operator endpoints" in by_key.json()["detail"]
    by_session = session_client.get("/api/v1/operator/nodes")
    assert by_session.status_code == 403 and by_session.json()["code"] == "staff_required"
    anonymous = APIClient().get("/api/v1/operator/nodes")
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "not_authenticated"
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    junk = APIClient()
    junk.credentials(HTTP_AUTHORIZATION="Bearer qv_nope.nope")
    assert junk.get("/api/v1/operator/nodes").json()["code"] == "invalid_api_key"
