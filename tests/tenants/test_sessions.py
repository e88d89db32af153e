"""Console sessions: login with CSRF and throttling, tenant choice, roles on every endpoint, staff reads all."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

from adapters_app.services import adapter_create
from tenants.models import ApiKey
from tenants.services import api_key_create, membership_create
from tests.factories import TenantFactory
from tests.tenants.invite import invite_and_accept

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


def _csrf_client() -> tuple[APIClient, str]:
    client = APIClient(enforce_csrf_checks=True)
    assert client.get("/api/v1/auth/me").status_code == 401
    return client, client.cookies["csrftoken"].value


def _login(client: APIClient, token: str, username: str, password: str) -> Any:
    return client.post("/api/v1/auth/login", {"username": username, "password": password}, format="json",
                       HTTP_X_CSRFTOKEN=token)


@pytest.fixture
def alice() -> User:
    user = User.objects.create_user(username="alice", password=PASSWORD)
    membership_create(TenantFactory(slug="acme"), user=user, role="owner")
    return user


def test_password_is_stored_hashed(alice: User) -> None:
    assert PASSWORD not in alice.password and alice.check_password(PASSWORD)


def test_login_needs_csrf_then_sets_a_session(alice: User) -> None:
    client, token = _csrf_client()
    no_token = client.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json")
    assert no_token.status_code == 403 and no_token.json()["code"] == "csrf_failed"
    resp = _login(client, token, "alice", PASSWORD)
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"username": "alice", "email": "", "is_staff": False, "tenant": "acme",
                           "tenants": [{"slug": "acme", "name": "Acme", "role": "owner"}]}
    assert client.get("/api/v1/adapters").status_code == 200
    # Unsafe calls in the session need the (rotated) token too.
    assert client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"]}, format="json").status_code == 403
    fresh = client.cookies["csrftoken"].value
    assert fresh != token
    created = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"]}, format="json",
                          HTTP_X_CSRFTOKEN=fresh)
    assert created.status_code == 201
    assert client.post("/api/v1/auth/logout", HTTP_X_CSRFTOKEN=fresh).status_code == 204
    assert client.get("/api/v1/adapters").status_code in (401, 403)


@override_settings(QUIVER_LOGIN_MAX_FAILURES=3)
def test_failed_logins_are_throttled_per_username(alice: User) -> None:
    client, token = _csrf_client()
    for _ in range(3):
        bad = _login(client, token, "alice", "wrong")
        assert bad.status_code == 401 and bad.json()["code"] == "invalid_credentials"
    locked = _login(client, token, "ALICE", PASSWORD)  # even the right password, any case
    assert locked.status_code == 429 and locked.json()["code"] == "login_throttled"
    assert 0 < int(locked["Retry-After"]) <= 900
    other = User.objects.create_user(username="bob", password=PASSWORD)
    membership_create(TenantFactory(), user=other)
    assert _login(client, token, "bob", PASSWORD).status_code == 200


def test_a_user_of_several_tenants_picks_one(alice: User) -> None:
    membership_create(TenantFactory(slug="beta"), user=alice, role="viewer")
    TenantFactory(slug="gamma")
    client = APIClient()
    client.force_login(alice)
    resp = client.get("/api/v1/adapters")
    assert resp.status_code == 400 and resp.json()["code"] == "tenant_required"
    assert client.get("/api/v1/adapters", HTTP_X_QUIVER_TENANT="beta").status_code == 200
    assert client.get("/api/v1/adapters", HTTP_X_QUIVER_TENANT="gamma").status_code == 404
    assert client.post("/api/v1/auth/tenant", {"tenant": "gamma"}, format="json").status_code == 404
    picked = client.post("/api/v1/auth/tenant", {"tenant": "beta"}, format="json")
    assert picked.status_code == 200 and picked.json()["tenant"] == "beta"
    # viewer in beta: reads yes, writes no; the header overrides the session's choice.
    assert client.get("/api/v1/adapters").status_code == 200
    assert client.post("/api/v1/adapters", {"name": "a", "base_model": "x"}, format="json").status_code == 403
    assert client.post("/api/v1/adapters", {"name": "a", "base_model": "x"}, format="json",
                       HTTP_X_QUIVER_TENANT="acme").status_code == 400  # owner in acme: past roles, unknown base


def _session(role: str, tenant: Any) -> tuple[APIClient, User]:
    user = User.objects.create_user(username=f"{role}-user", password=PASSWORD)
    membership_create(tenant, user=user, role=role)
    client = APIClient()
    client.force_login(user)
    return client, user


@pytest.mark.parametrize(("role", "upload", "delete", "keys", "members_write"), [
    ("viewer", 403, 403, 403, 403),
    ("member", 201, 403, 201, 403),
    ("owner", 201, 204, 201, 202),  # an invitation, accepted by the user in the console (tenants.invitations)
])
def test_roles_on_every_endpoint(role: str, upload: int, delete: int, keys: int, members_write: int,
                                 base_model: Any) -> None:
    tenant = TenantFactory()
    adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    client, _ = _session(role, tenant)
    assert client.get("/api/v1/adapters").status_code == 200
    assert client.get("/api/v1/usage").status_code == 200
    assert client.get("/api/v1/members").status_code == 200
    assert client.post("/api/v1/adapters", {"name": "new", "base_model": "tiny-llama"},
                       format="json").status_code == upload
    assert client.post("/api/v1/api-keys", {"name": "k", "scopes": ["inference"]}, format="json").status_code == keys
    User.objects.create_user(username="carol", password="x")
    assert client.post("/api/v1/members", {"username": "carol", "role": "viewer"},
                       format="json").status_code == members_write
    assert client.delete("/api/v1/adapters/bot").status_code == delete


def test_members_manage_only_their_own_keys_and_cannot_grant_keys_manage() -> None:
    tenant = TenantFactory()
    owner_key, _ = api_key_create(tenant, name="owner's")
    client, user = _session("member", tenant)
    escalate = client.post("/api/v1/api-keys", {"name": "k", "scopes": ["keys:manage"]}, format="json")
    assert escalate.status_code == 400 and "scopes" in escalate.json()["fields"]
    mine = client.post("/api/v1/api-keys", {"name": "mine", "scopes": ["inference", "adapters:read"]}, format="json")
    assert mine.status_code == 201 and mine.json()["secret"].startswith("qv_")
    assert [k["name"] for k in client.get("/api/v1/api-keys").json()] == ["mine"]
    assert client.post(f"/api/v1/api-keys/{owner_key.key_id}/revoke").status_code == 404
    assert ApiKey.objects.get(pk=owner_key.pk).enabled
    assert ApiKey.objects.get(key_id=mine.json()["key_id"]).created_by == user


def test_the_last_owner_cannot_be_demoted_or_removed() -> None:
    tenant = TenantFactory()
    client, user = _session("owner", tenant)
    resp = client.patch(f"/api/v1/members/{user.username}", {"role": "member"}, format="json")
    assert resp.status_code == 400 and "role" in resp.json()["fields"]
    assert client.delete(f"/api/v1/members/{user.username}").status_code == 400
    bob = User.objects.create_user(username="bob", password="x")
    invite_and_accept(client, bob, role="owner")
    assert client.patch(f"/api/v1/members/{user.username}", {"role": "member"}, format="json").status_code == 200
    assert bob.memberships.get().role == "owner"


def test_staff_read_every_tenant_but_do_not_write(base_model: Any) -> None:
    acme, beta = TenantFactory(), TenantFactory()
    adapter_create(acme, name="a-bot", base_model_name="tiny-llama")
    adapter_create(beta, name="b-bot", base_model_name="tiny-llama")
    staff = User.objects.create_user(username="op", password=PASSWORD, is_staff=True)
    client = APIClient()
    client.force_login(staff)
    me = client.get("/api/v1/auth/me").json()
    assert me["is_staff"] and {t["slug"] for t in me["tenants"]} >= {acme.slug, beta.slug}
    assert client.get("/api/v1/adapters").json()["code"] == "tenant_required"
    names = [a["name"] for a in client.get("/api/v1/adapters", HTTP_X_QUIVER_TENANT=beta.slug).json()]
    assert names == ["b-bot"]
    assert client.delete("/api/v1/adapters/b-bot", HTTP_X_QUIVER_TENANT=beta.slug).status_code == 403


def test_a_user_in_no_tenant_is_told_so() -> None:
    user = User.objects.create_user(username="lonely", password=PASSWORD)
    client = APIClient()
    client.force_login(user)
    resp = client.get("/api/v1/adapters")
    assert resp.status_code == 403 and resp.json()["code"] == "no_tenant"


def test_a_bearer_key_wins_over_a_session(alice: User) -> None:
    other = TenantFactory()
    _, plaintext = api_key_create(other, name="k", scopes=["adapters:read"])
    client = APIClient()
    client.force_login(alice)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/members").status_code == 403  # the key's scopes rule, not alice's owner role


@override_settings(QUIVER_LOGIN_MAX_FAILURES=3, QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT=5)
def test_an_attacker_elsewhere_cannot_lock_the_account_out(alice: User) -> None:
    # The strict limit counts the username from one address: five wrong passwords from anywhere locked any account.
    attacker, token = _csrf_client()
    for _ in range(3):
        assert _login(attacker, token, "alice", "wrong").status_code == 401
    assert _login(attacker, token, "alice", PASSWORD).status_code == 429  # that address is throttled
    owner, owner_token = _csrf_client()
    answer = owner.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json",
                        HTTP_X_CSRFTOKEN=owner_token, REMOTE_ADDR="10.0.0.7")
    assert answer.status_code == 200, answer.content
    # The account as a whole has a ceiling over all addresses, but it refuses only addresses that already failed
    # for it: guessed at from five more addresses, the account still opens with its password from a clean one
    # (the ceiling locked everyone out, the owner included: attack-round finding, issue 30).
    for i in range(5):
        attacker.post("/api/v1/auth/login", {"username": "alice", "password": "wrong"}, format="json",
                      HTTP_X_CSRFTOKEN=token, REMOTE_ADDR=f"10.0.1.{i}")
    later, later_token = _csrf_client()
    again = later.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json",
                       HTTP_X_CSRFTOKEN=later_token, REMOTE_ADDR="10.0.0.8")
    assert again.status_code == 200, again.content
    # ... while a guesser's address that failed once is refused from now on, even with the right password.
    dirty, dirty_token = _csrf_client()
    refused = dirty.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json",
                         HTTP_X_CSRFTOKEN=dirty_token, REMOTE_ADDR="10.0.1.0")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0


@override_settings(QUIVER_LOGIN_MAX_FAILURES=3)
def test_the_owners_login_does_not_reset_a_guessers_count(alice: User) -> None:
    attacker, token = _csrf_client()
    for _ in range(2):
        attacker.post("/api/v1/auth/login", {"username": "alice", "password": "wrong"}, format="json",
                      HTTP_X_CSRFTOKEN=token, REMOTE_ADDR="10.0.9.9")
    owner, owner_token = _csrf_client()
    assert owner.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json",
                      HTTP_X_CSRFTOKEN=owner_token, REMOTE_ADDR="10.0.0.7").status_code == 200
    # Two failures stand for the guesser: one more wrong guess and the address is locked for alice.
    attacker.post("/api/v1/auth/login", {"username": "alice", "password": "wrong"}, format="json",
                  HTTP_X_CSRFTOKEN=token, REMOTE_ADDR="10.0.9.9")
    blocked = attacker.post("/api/v1/auth/login", {"username": "alice", "password": PASSWORD}, format="json",
                            HTTP_X_CSRFTOKEN=token, REMOTE_ADDR="10.0.9.9")
    assert blocked.status_code == 429


def test_the_console_probe_answers_200_before_login_and_tells_nothing(alice: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    probe = client.get("/api/v1/auth/session")
    # 200 without a session (no failed request in the browser's console), nothing about any user or tenant, and
    # the CSRF cookie the login form needs; never cached.
    assert probe.status_code == 200 and probe.json() == {"authenticated": False, "me": None}
    assert probe["Cache-Control"] == "no-store"
    token = client.cookies["csrftoken"].value
    # A key is no console session: the probe says "not logged in", as for anyone else.
    _, key = api_key_create(alice.memberships.get().tenant, name="k")
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {key}").get("/api/v1/auth/session").json() == {
        "authenticated": False, "me": None}
    assert _login(client, token, "alice", PASSWORD).status_code == 200
    assert client.get("/api/v1/auth/session").json() == {"authenticated": True, "me": client.get("/api/v1/auth/me").json()}
    client.post("/api/v1/auth/logout", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert client.get("/api/v1/auth/session").json() == {"authenticated": False, "me": None}
