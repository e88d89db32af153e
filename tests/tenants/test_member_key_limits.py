"""A member cannot escape per-key limits an owner set by minting a fresh key (issue 30 point 7).

The attack round: an owner limited a member's key (rpm, tpm...), the member minted a new key from the console and
it was unlimited. Now the limits an owner sets on a member's key bind every key that member mints later, and a key
minted by a key starts no looser than its parent. Checked through the API on PostgreSQL and through what the
gateway reads for the new key (``inference.gateway.directory.load_key``).
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from inference.gateway.directory import load_key
from tenants.services import api_key_create, membership_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(django_user_model: Any) -> tuple[APIClient, APIClient, Any]:
    """(owner's session, member's session, tenant)."""
    tenant = TenantFactory()
    sessions = []
    for role in ("owner", "member"):
        user = django_user_model.objects.create_user(username=f"{role}-x", password="pw-not-used")
        membership_create(tenant, user=user, role=role)
        client = APIClient()
        client.force_login(user)
        sessions.append(client)
    return sessions[0], sessions[1], tenant


def test_a_fresh_key_carries_the_limits_an_owner_set_on_the_members_key(team: tuple[APIClient, APIClient, Any]) -> None:
    owner, member, _ = team
    first = member.post("/api/v1/api-keys", {"name": "app", "scopes": ["inference"]}, format="json").json()["key_id"]
    limited = owner.patch(f"/api/v1/api-keys/{first}", {"rpm_limit": 5, "tpm_limit": 1000,
                                                        "priority_class": "low"}, format="json")
    assert limited.status_code == 200, limited.content
    # The member cannot loosen it (unchanged) ...
    assert member.patch(f"/api/v1/api-keys/{first}", {"rpm_limit": None}, format="json").status_code == 403
    # ... nor escape it with a new key: it starts with the owner's limits, and the gateway enforces them.
    fresh = member.post("/api/v1/api-keys", {"name": "escape", "scopes": ["inference"]}, format="json")
    assert fresh.status_code == 201
    body = fresh.json()
    assert (body["rpm_limit"], body["tpm_limit"], body["priority_class"]) == (5, 1000, "low"), body
    view = load_key(body["key_id"])
    assert view is not None and (view.key_limits.rpm, view.key_limits.tpm, view.priority) == (5, 1000, 1)
    # A member may still tighten a fresh key; an owner's cleared limit no longer binds later keys.
    assert member.patch(f"/api/v1/api-keys/{body['key_id']}", {"rpm_limit": 2}, format="json").status_code == 200
    owner.patch(f"/api/v1/api-keys/{first}", {"rpm_limit": None}, format="json")
    later = member.post("/api/v1/api-keys", {"name": "later", "scopes": ["inference"]}, format="json").json()
    assert (later["rpm_limit"], later["tpm_limit"]) == (None, 1000)


def test_an_owners_own_keys_and_limits_bind_no_member(team: tuple[APIClient, APIClient, Any]) -> None:
    owner, member, _ = team
    own = owner.post("/api/v1/api-keys", {"name": "mine"}, format="json").json()["key_id"]
    owner.patch(f"/api/v1/api-keys/{own}", {"rpm_limit": 1}, format="json")
    assert owner.post("/api/v1/api-keys", {"name": "again"}, format="json").json()["rpm_limit"] is None
    assert member.post("/api/v1/api-keys", {"name": "app", "scopes": ["inference"]}, format="json").json()["rpm_limit"] is None


def test_a_key_minted_by_a_limited_key_is_no_looser() -> None:
    tenant = TenantFactory()
    parent, plaintext = api_key_create(tenant, name="manager", scopes=["keys:manage", "inference"])
    parent.rpm_limit, parent.concurrency_limit = 10, 2
    parent.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    child = client.post("/api/v1/api-keys", {"name": "child", "scopes": ["inference"]}, format="json").json()
    assert (child["rpm_limit"], child["concurrency_limit"]) == (10, 2), child


def test_a_limited_key_cannot_loosen_its_own_limits_or_its_childrens() -> None:
    """Attack round: a keys:manage key an owner limited PATCHed itself back to unlimited, raised its priority class
    and cleared the limits its child inherited; each is now a 403, and tightening still works."""
    tenant = TenantFactory()
    parent, plaintext = api_key_create(tenant, name="manager", scopes=["keys:manage", "inference"])
    parent.rpm_limit, parent.tpm_limit, parent.priority_class = 2, 100, "low"
    parent.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    child = client.post("/api/v1/api-keys", {"name": "child", "scopes": ["inference"]}, format="json").json()
    for key_id in (parent.key_id, child["key_id"]):
        for change in ({"rpm_limit": None}, {"tpm_limit": 5000}, {"priority_class": "high"}):
            refused = client.patch(f"/api/v1/api-keys/{key_id}", change, format="json")
            assert refused.status_code == 403 and refused.json()["code"] == "limit_owner_only", (key_id, change)
    parent.refresh_from_db()
    assert (parent.rpm_limit, parent.tpm_limit, parent.priority_class) == (2, 100, "low")
    tighter = client.patch(f"/api/v1/api-keys/{child['key_id']}", {"tpm_limit": 50}, format="json")
    assert tighter.status_code == 200 and tighter.json()["tpm_limit"] == 50
