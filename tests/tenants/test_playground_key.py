"""``POST /api/v1/api-keys/playground``: the console playground's key is one row per user and tenant, reused (its
secret replaced) on every visit, inference-only, expiring in an hour, shown once, and for sessions only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiKey
from tenants.services import ApiKeyInvalid, api_key_create, api_key_verify, membership_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db
PATH = "/api/v1/api-keys/playground"


def _session(role: str, tenant, username: str = "alice") -> tuple[APIClient, User]:  # type: ignore[no-untyped-def]
    user = User.objects.create_user(username=username, password="x")
    membership_create(tenant, user=user, role=role)
    client = APIClient()
    client.force_login(user)
    return client, user


def test_visits_reuse_one_key_whose_old_secret_stops_working() -> None:
    tenant = TenantFactory()
    client, user = _session("member", tenant)
    first = client.post(PATH)
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["scopes"] == ["inference"] and body["console_playground"] is True and body["secret"].startswith("qv_")
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert timedelta(minutes=59) < expires - timezone.now() <= timedelta(hours=1)
    assert api_key_verify(body["secret"]).key_id == body["key_id"]

    for _ in range(3):  # three more visits (tabs, reloads): still one key in the list
        again = client.post(PATH)
        assert again.status_code == 201 and again.json()["key_id"] == body["key_id"]
    assert [k["key_id"] for k in client.get("/api/v1/api-keys").json()] == [body["key_id"]]
    assert ApiKey.objects.filter(tenant=tenant).count() == 1
    with pytest.raises(ApiKeyInvalid):  # each call shows a new secret once; the previous one is dead
        api_key_verify(body["secret"])
    assert api_key_verify(again.json()["secret"]).created_by == user


def test_each_user_and_tenant_has_its_own_and_a_revoked_one_stays_revoked() -> None:
    tenant, other = TenantFactory(), TenantFactory()
    alice, _ = _session("member", tenant)
    bob, _ = _session("owner", tenant, username="bob")
    a, b = alice.post(PATH).json(), bob.post(PATH).json()
    assert a["key_id"] != b["key_id"]
    assert [k["key_id"] for k in alice.get("/api/v1/api-keys").json()] == [a["key_id"]]  # members see their own

    assert alice.post(f"/api/v1/api-keys/{a['key_id']}/revoke").status_code == 200
    fresh = alice.post(PATH).json()
    assert fresh["key_id"] != a["key_id"] and not ApiKey.objects.get(key_id=a["key_id"]).enabled
    assert ApiKey.objects.filter(tenant=other).count() == 0


def test_members_limits_bind_it_and_viewers_and_keys_are_refused() -> None:
    tenant = TenantFactory()
    owner, _ = _session("owner", tenant, username="olga")
    member, _ = _session("member", tenant)
    mine = member.post("/api/v1/api-keys", {"name": "mine", "scopes": ["inference"]}, format="json").json()
    assert owner.patch(f"/api/v1/api-keys/{mine['key_id']}", {"rpm_limit": 5}, format="json").status_code == 200
    assert member.post(PATH).json()["rpm_limit"] == 5

    viewer, _ = _session("viewer", tenant, username="vic")
    assert viewer.post(PATH).status_code == 403
    _, plaintext = api_key_create(tenant, name="ci")
    by_key = APIClient()
    by_key.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    refused = by_key.post(PATH)
    assert refused.status_code == 403 and refused.json()["code"] == "session_only"
