"""API keys: shown once, stored as a digest, revocable, expiring, ``last_used_at`` throttled, 401 on failure."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiKey
from tenants.scopes import ALL_SCOPES
from tenants.services import ApiKeyInvalid, api_key_create, api_key_revoke, api_key_verify
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_key_is_shown_once_and_stored_as_digest() -> None:
    key, plaintext = api_key_create(TenantFactory(), name="ci")
    secret = plaintext.split(".", 1)[1]
    assert plaintext.startswith(f"qv_{key.key_id}.")
    assert secret not in key.digest and len(key.digest) == 64
    assert api_key_verify(plaintext).pk == key.pk
    with pytest.raises(ApiKeyInvalid):
        api_key_verify(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B"))


@pytest.mark.parametrize("raw", ["", "qv_nodot", "sk-abc.def", "qv_unknown.secret"])
def test_malformed_or_unknown_keys_are_refused(raw: str) -> None:
    with pytest.raises(ApiKeyInvalid):
        api_key_verify(raw)


def test_revoked_key_gets_401(make_client) -> None:  # type: ignore[no-untyped-def]
    client, tenant, plaintext = make_client()
    assert client.get("/api/v1/adapters").status_code == 200
    api_key_revoke(tenant, key_id=plaintext[3:].split(".")[0])
    resp = client.get("/api/v1/adapters")
    assert resp.status_code == 401
    assert resp.json()["code"] == "invalid_api_key"
    assert resp["WWW-Authenticate"].startswith("Bearer")


def test_expired_key_gets_401(make_client) -> None:  # type: ignore[no-untyped-def]
    client, tenant, plaintext = make_client()
    ApiKey.objects.filter(tenant=tenant).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get("/api/v1/adapters").status_code == 401


def test_missing_key_gets_401() -> None:
    resp = APIClient().get("/api/v1/adapters")
    assert resp.status_code == 401


def test_last_used_is_written_at_most_once_a_minute() -> None:
    key, plaintext = api_key_create(TenantFactory(), name="ci")
    api_key_verify(plaintext)
    first = ApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    api_key_verify(plaintext)
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(seconds=61))
    api_key_verify(plaintext)
    assert ApiKey.objects.get(pk=key.pk).last_used_at > first


def test_keys_api_creates_lists_masked_and_revokes(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    created = client.post("/api/v1/api-keys", {"name": "app", "scopes": ["inference"]}, format="json")
    assert created.status_code == 201
    secret = created.json()["secret"]
    listed = client.get("/api/v1/api-keys").json()
    assert all("secret" not in k and k["key"].endswith(".****") for k in listed)
    key_id = created.json()["key_id"]
    assert client.post(f"/api/v1/api-keys/{key_id}/revoke").json()["enabled"] is False
    revoked_client = APIClient()
    revoked_client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert revoked_client.get("/api/v1/adapters").status_code == 401


def test_scope_is_enforced(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client(scopes=["inference"])
    resp = client.get("/api/v1/adapters")
    assert resp.status_code == 403
    assert resp.json()["code"] == "permission_denied"
    assert "'adapters:read'" in resp.json()["detail"]  # names the scope to ask for
    assert "console's API keys page" in resp.json()["detail"]  # the page as the console's navbar names it


def test_unknown_scope_is_a_field_error(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    resp = client.post("/api/v1/api-keys", {"name": "x", "scopes": ["root"]}, format="json")
    assert resp.status_code == 400
    assert "scopes" in resp.json()["fields"]
    # The valid scopes are listed (it was '"root" is not a valid choice.').
    assert resp.json()["detail"] == ("Invalid input for 'scopes': \"root\" is not a scope; the scopes are: "
                                     "adapters:read, adapters:write, keys:manage, inference.")
    resp = client.post("/api/v1/api-keys", {"name": "x", "priority_class": "urgent"}, format="json")
    assert resp.status_code == 400
    assert resp.json()["fields"]["priority_class"] == ["\"urgent\" is not a priority class; use one of: high, normal, low."]


def test_a_bad_adapter_name_in_a_key_is_refused_with_the_naming_rule(make_client) -> None:  # type: ignore[no-untyped-def]
    """It read "This value does not match the required pattern.", and `a--b` (no adapter can have it) passed."""
    client, _, _ = make_client()
    for bad in ("nope bot", "a--b", "bot@0"):
        resp = client.post("/api/v1/api-keys", {"name": "x", "adapters": ["ok", bad]}, format="json")
        assert resp.status_code == 400, (bad, resp.content)
        rule = (f'"{bad}" is not an adapter name: use 1-40 lowercase letters, digits or single hyphens, starting and '
                "ending with a letter or digit, optionally followed by @N to allow version N alone "
                "(e.g. support-bot or ranker@2).")
        assert resp.json()["fields"]["adapters"] == {"1": [rule]}
        assert rule in resp.json()["detail"] and "adapters" in resp.json()["detail"]
    assert client.post("/api/v1/api-keys", {"name": "x", "adapters": ["support-bot", "ranker@2"]},
                       format="json").status_code == 201


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "expires_at": "2000-01-01T00:00:00Z"}, "expires_at"),
    ({"name": "x", "scopes": []}, "scopes"),
])
def test_bad_key_requests_are_json_field_errors(make_client, body, field) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    resp = client.post("/api/v1/api-keys", body, format="json")
    assert resp.status_code == 400
    assert field in resp.json()["fields"] and "ErrorDetail" not in resp.json()["detail"]


def test_unknown_routes_answer_json() -> None:
    api = APIClient().get("/api/v1/adapters/Upper/versions")
    assert api.status_code == 404 and api.json()["code"] == "not_found"
    gateway = APIClient().get("/v1/embeddings")
    assert gateway.status_code == 404 and gateway.json()["error"]["code"] == "not_found"


def test_a_key_cannot_mint_a_stronger_key(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client(scopes=["keys:manage"])
    resp = client.post("/api/v1/api-keys", {"name": "x", "scopes": ["inference"]}, format="json")
    assert resp.status_code == 400 and "inference" in resp.json()["fields"]["scopes"][0]
    ok = client.post("/api/v1/api-keys", {"name": "y", "scopes": ["keys:manage"]}, format="json")
    assert ok.status_code == 201


@pytest.mark.django_db
def test_key_limits_are_editable_and_checked(make_client) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    key_id = client.post("/api/v1/api-keys", {"name": "bot"}, format="json").json()["key_id"]
    resp = client.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": 30, "max_tokens_limit": 256}, format="json")
    assert resp.status_code == 200, resp.content
    assert (resp.json()["rpm_limit"], resp.json()["max_tokens_limit"], resp.json()["tpm_limit"]) == (30, 256, None)
    bad = client.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": 0}, format="json")
    assert bad.status_code == 400 and "rpm_limit" in bad.json()["fields"]
    other = client.patch(f"/api/v1/api-keys/{key_id}", {"name": "renamed"}, format="json")
    assert other.status_code == 400 and "name" in other.json()["fields"]
    assert client.patch(f"/api/v1/api-keys/{key_id}", {"rpm_limit": None}, format="json").json()["rpm_limit"] is None


@pytest.mark.django_db
def test_key_priority_class_is_editable_and_never_ranks_above_its_tenant(make_client) -> None:  # type: ignore[no-untyped-def]
    from inference.gateway.directory import load_key

    client, tenant, _ = make_client()
    key_id = client.post("/api/v1/api-keys", {"name": "batch"}, format="json").json()["key_id"]
    bad = client.patch(f"/api/v1/api-keys/{key_id}", {"priority_class": "urgent"}, format="json")
    assert bad.status_code == 400 and "priority_class" in bad.json()["fields"]
    assert load_key(key_id).priority == 0  # type: ignore[union-attr]  # normal by default
    resp = client.patch(f"/api/v1/api-keys/{key_id}", {"priority_class": "low"}, format="json")
    assert resp.status_code == 200 and resp.json()["priority_class"] == "low"
    assert load_key(key_id).priority == 1  # type: ignore[union-attr]  # vLLM runs lower values first
    client.patch(f"/api/v1/api-keys/{key_id}", {"priority_class": "high"}, format="json")
    assert load_key(key_id).priority == 0  # type: ignore[union-attr]  # a key cannot outrank its normal tenant
    tenant.priority_class = "high"
    tenant.save()
    assert load_key(key_id).priority == -1  # type: ignore[union-attr]


@pytest.mark.django_db
def test_tenant_limits_are_readable_by_the_tenant_and_set_by_operators(make_client, django_user_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    assert client.get("/api/v1/tenant/limits").json() == {"rpm_limit": None, "tpm_limit": None,
                                                          "concurrency_limit": None, "max_tokens_limit": None,
                                                          "priority_class": None}
    assert client.patch("/api/v1/tenant/limits", {"rpm_limit": 10**6}, format="json").status_code == 403
    staff = django_user_model.objects.create_user(username="op", password="pw-op-123456", is_staff=True)
    operator = APIClient()
    operator.force_login(staff)
    resp = operator.patch("/api/v1/tenant/limits", {"rpm_limit": 100, "tpm_limit": 5000}, format="json",
                          HTTP_X_QUIVER_TENANT=tenant.slug)
    assert resp.status_code == 200, resp.content
    tenant.refresh_from_db()
    assert (tenant.rpm_limit, tenant.tpm_limit) == (100, 5000)


@pytest.mark.parametrize("method", ["get", "patch"])
def test_a_nul_in_a_key_id_is_404_not_a_database_error(make_client, method: str) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL refuses NUL in text (DataError): the path names no key, so 404 like any unknown id (was 500)."""
    client, _, _ = make_client()
    resp = getattr(client, method)("/api/v1/api-keys/a%00b", format="json")
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    resp = client.post("/api/v1/api-keys/a%00b/revoke")
    assert resp.status_code == 404


def test_a_key_asked_for_by_name_alone_gets_every_scope_its_caller_may_grant(make_client, make_session_client) -> None:  # type: ignore[no-untyped-def]
    """Without ``scopes`` a key gets "all yours": an owner's session every scope, a member's all but
    ``keys:manage`` (which their role cannot grant: they got a 400 for a scope they never asked for), a key's
    its own."""
    owner, tenant, _ = make_session_client(role="owner")
    assert set(owner.post("/api/v1/api-keys", {"name": "o"}, format="json").json()["scopes"]) == set(ALL_SCOPES)
    member, _, _ = make_session_client(role="member")
    made = member.post("/api/v1/api-keys", {"name": "m"}, format="json")
    assert made.status_code == 201, made.content
    assert set(made.json()["scopes"]) == set(ALL_SCOPES) - {"keys:manage"}
    client, _, _ = make_client(scopes=["keys:manage", "inference"])
    assert set(client.post("/api/v1/api-keys", {"name": "k"}, format="json").json()["scopes"]) == {
        "keys:manage", "inference"}


def test_a_limited_keys_manage_key_cannot_revoke_a_stronger_key(make_client) -> None:  # type: ignore[no-untyped-def]
    """A key revokes itself or keys it could have minted: a ``keys:manage`` key under TPM 1,000 revoked the owner's
    unlimited, full-scope key (attack round)."""
    owner_client, tenant, owner_key = make_client()
    owner_id = owner_key.split("_", 1)[1].split(".")[0]
    limited, limited_plain = api_key_create(tenant, name="lim", scopes=["keys:manage", "inference"],
                                            limits={"tpm_limit": 1000})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {limited_plain}")
    refused = client.post(f"/api/v1/api-keys/{owner_id}/revoke")
    assert (refused.status_code, refused.json()["code"]) == (403, "key_stronger"), refused.content
    assert ApiKey.objects.get(key_id=owner_id).enabled
    weaker, _ = api_key_create(tenant, name="weak", scopes=["inference"], limits={"tpm_limit": 500})
    unlimited_inference, _ = api_key_create(tenant, name="unl", scopes=["inference"])
    assert client.post(f"/api/v1/api-keys/{weaker.key_id}/revoke").status_code == 200
    assert client.post(f"/api/v1/api-keys/{unlimited_inference.key_id}/revoke").status_code == 403  # looser TPM
    assert client.post(f"/api/v1/api-keys/{limited.key_id}/revoke").status_code == 200  # itself
    assert owner_client.post(f"/api/v1/api-keys/{weaker.key_id}/revoke").status_code == 200  # idempotent


def test_limits_can_be_set_when_a_key_is_made_and_unknown_fields_are_named(make_client,  # type: ignore[no-untyped-def]
                                                                          make_session_client) -> None:
    """``tpm_limit`` in the create body was dropped without a word, leaving the key unlimited (attack round)."""
    client, tenant, _ = make_client()
    made = client.post("/api/v1/api-keys", {"name": "capped", "scopes": ["inference"], "tpm_limit": 1000,
                                            "rpm_limit": 10}, format="json")
    assert made.status_code == 201 and (made.json()["tpm_limit"], made.json()["rpm_limit"]) == (1000, 10)
    bad = client.post("/api/v1/api-keys", {"name": "x", "tpm_limt": 1000}, format="json")
    assert bad.status_code == 400 and "tpm_limt" in bad.json()["fields"]
    minted = ApiKey.objects.get(key_id=made.json()["key_id"])
    child = APIClient()
    _, child_plain = api_key_create(tenant, name="km", scopes=["keys:manage", "inference"], limits={"tpm_limit": 100})
    child.credentials(HTTP_AUTHORIZATION=f"Bearer {child_plain}")
    looser = child.post("/api/v1/api-keys", {"name": "y", "scopes": ["inference"], "tpm_limit": 5000}, format="json")
    assert looser.status_code == 201 and looser.json()["tpm_limit"] == 100  # never looser than its parent's
    assert minted.tpm_limit == 1000


def test_a_limited_keys_manage_key_cannot_tighten_a_stronger_key(make_client) -> None:  # type: ignore[no-untyped-def]
    """As for revoking: a ``keys:manage`` key under TPM 1,000 set ``rpm_limit`` 1 and ``max_tokens_limit`` 1 on the
    owner's unlimited, full-scope key (cutting its application off as surely as a revoke; attack round)."""
    _, tenant, owner_key = make_client()
    owner_id = owner_key.split("_", 1)[1].split(".")[0]
    _, limited_plain = api_key_create(tenant, name="lim", scopes=["keys:manage", "inference"],
                                      limits={"tpm_limit": 1000})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {limited_plain}")
    refused = client.patch(f"/api/v1/api-keys/{owner_id}", {"rpm_limit": 1, "max_tokens_limit": 1}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (403, "key_stronger"), refused.content
    owner = ApiKey.objects.get(key_id=owner_id)
    assert (owner.rpm_limit, owner.max_tokens_limit) == (None, None)
    weaker, _ = api_key_create(tenant, name="weak", scopes=["inference"], limits={"tpm_limit": 500})
    ok = client.patch(f"/api/v1/api-keys/{weaker.key_id}", {"rpm_limit": 5}, format="json")
    assert ok.status_code == 200 and ok.json()["rpm_limit"] == 5
