"""A key never outlives the standing that minted it: removal and demotion revoke a member's keys; a key cannot mint
a key that expires after it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiKey
from tenants.services import api_key_create
from tests.tenants.invite import invite_and_accept

pytestmark = pytest.mark.django_db


def _key_client(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def _member_key(make_session_client: Any, role: str = "member", scopes: list[str] | None = None) -> Any:
    owner, tenant, _ = make_session_client(role="owner")
    member, _, user = make_session_client(role="viewer")  # a second user; its own tenant is unused
    invite_and_accept(owner, user, role)
    member.credentials(HTTP_X_QUIVER_TENANT=tenant.slug)
    resp = member.post("/api/v1/api-keys", {"name": "laptop", "scopes": scopes or ["adapters:read", "inference"]},
                       format="json")
    assert resp.status_code == 201, resp.content
    return owner, user, resp.json()["secret"]


def test_removing_a_member_revokes_the_keys_they_created(make_session_client: Any) -> None:
    owner, user, secret = _member_key(make_session_client)
    assert _key_client(secret).get("/api/v1/adapters").status_code == 200
    assert owner.delete(f"/api/v1/members/{user.username}").status_code == 204
    assert _key_client(secret).get("/api/v1/adapters").status_code == 401


def test_demoting_to_viewer_revokes_the_members_keys(make_session_client: Any) -> None:
    owner, user, secret = _member_key(make_session_client)
    assert owner.patch(f"/api/v1/members/{user.username}", {"role": "viewer"}, format="json").status_code == 200
    assert _key_client(secret).get("/api/v1/adapters").status_code == 401


def test_owner_made_member_loses_only_keys_manage_keys(make_session_client: Any) -> None:
    owner, user, manage = _member_key(make_session_client, role="owner", scopes=["keys:manage"])
    plain = _key_client(manage).post("/api/v1/api-keys", {"name": "ci", "scopes": ["keys:manage"]}, format="json")
    assert plain.status_code == 201  # minted by the user's key: still the user's
    session_read = owner.post("/api/v1/api-keys", {"name": "r", "scopes": ["adapters:read"]}, format="json")
    assert session_read.status_code == 201
    assert owner.patch(f"/api/v1/members/{user.username}", {"role": "member"}, format="json").status_code == 200
    assert _key_client(manage).get("/api/v1/api-keys").status_code == 401
    assert _key_client(plain.json()["secret"]).get("/api/v1/api-keys").status_code == 401
    assert _key_client(session_read.json()["secret"]).get("/api/v1/adapters").status_code == 200


def test_keys_minted_by_a_members_key_go_with_the_member(make_session_client: Any) -> None:
    owner, user, manage = _member_key(make_session_client, role="owner", scopes=["keys:manage", "adapters:read"])
    child = _key_client(manage).post("/api/v1/api-keys", {"name": "c", "scopes": ["adapters:read"]}, format="json")
    assert child.status_code == 201
    assert owner.delete(f"/api/v1/members/{user.username}").status_code == 204
    assert _key_client(child.json()["secret"]).get("/api/v1/adapters").status_code == 401


def test_a_key_cannot_mint_a_key_that_outlives_it(make_client: Any) -> None:
    soon = timezone.now() + timedelta(hours=1)
    client, tenant, _ = make_client(expires_at=soon)
    later = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"],
                                             "expires_at": (soon + timedelta(days=1)).isoformat()}, format="json")
    assert later.status_code == 400 and "expires_at" in later.json()["fields"]
    inherited = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"]}, format="json")
    assert inherited.status_code == 201, inherited.content
    assert ApiKey.objects.get(key_id=inherited.json()["key_id"]).expires_at == soon
    earlier = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"],
                                               "expires_at": (soon - timedelta(minutes=5)).isoformat()}, format="json")
    assert earlier.status_code == 201


def test_keys_without_expiry_still_mint_keys_without_expiry(make_client: Any) -> None:
    client, tenant, _ = make_client()
    resp = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"]}, format="json")
    assert resp.status_code == 201 and resp.json()["expires_at"] is None
    assert api_key_create(tenant, name="x")[0].expires_at is None


def test_a_members_key_cannot_do_what_only_owners_may(make_session_client: Any) -> None:
    """A member may mint an adapters:write key, but deleting an adapter is owner-only (attack: member session 403,
    the member's key 204). The member's key gets 403 before any lookup; an owner's key with the same scopes passes
    the check (404: no such adapter)."""
    owner, _, secret = _member_key(make_session_client, scopes=["adapters:read", "adapters:write"])
    refused = _key_client(secret).delete("/api/v1/adapters/nope")
    assert refused.status_code == 403 and "owner" in refused.json()["detail"]
    assert _key_client(secret).get("/api/v1/adapters").status_code == 200  # its other powers stay
    made = owner.post("/api/v1/api-keys", {"name": "o", "scopes": ["adapters:read", "adapters:write"]}, format="json")
    assert _key_client(made.json()["secret"]).delete("/api/v1/adapters/nope").status_code == 404


def test_a_member_may_tighten_but_not_lift_what_an_owner_set_on_their_key(make_session_client: Any) -> None:
    owner, user, secret = _member_key(make_session_client)
    key_id = secret.split("_", 1)[1].split(".")[0]
    set_ = owner.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": 10, "priority_class": "low"}, format="json")
    assert set_.status_code == 200, set_.content
    member = APIClient()
    member.force_login(user)
    member.credentials(HTTP_X_QUIVER_TENANT=ApiKey.objects.get(key_id=key_id).tenant.slug)
    for body in ({"rpm_limit": None}, {"rpm_limit": 11}, {"priority_class": "high"}):
        resp = member.patch(f"/api/v1/api-keys/{key_id}", body, format="json")
        assert resp.status_code == 403 and resp.json()["code"] == "limit_owner_only", body
    assert member.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": 5, "tpm_limit": 1000},
                        format="json").status_code == 200
    key = ApiKey.objects.get(key_id=key_id)
    assert (key.rpm_limit, key.tpm_limit, key.priority_class) == (5, 1000, "low")
    assert owner.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": None}, format="json").status_code == 200
