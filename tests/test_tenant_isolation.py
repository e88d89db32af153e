"""Another tenant's object is a 404 on every endpoint, never a 403 (conventions §3, netbox APIViewTestCases style)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from tenants.services import api_key_create

pytestmark = pytest.mark.django_db

# (method, path, body) reaching tenant B's adapter "secret-bot", version 1 and key; {key_id} filled per test.
CROSS_TENANT_CALLS = [
    ("get", "/api/v1/adapters/secret-bot", None),
    ("delete", "/api/v1/adapters/secret-bot", None),
    ("get", "/api/v1/adapters/secret-bot/versions", None),
    ("get", "/api/v1/adapters/secret-bot/versions/1", None),
    ("post", "/api/v1/adapters/secret-bot/versions", "upload"),
    ("get", "/api/v1/api-keys/{key_id}", None),
    ("post", "/api/v1/api-keys/{key_id}/revoke", None),
]


@pytest.fixture
def other_tenant(make_client, base_model):  # type: ignore[no-untyped-def]
    _, tenant_b, _ = make_client(slug="tenant-b")
    adapter_create(tenant_b, name="secret-bot", base_model_name="tiny-llama")
    key_b, _ = api_key_create(tenant_b, name="b-key")
    return tenant_b, key_b


@pytest.mark.parametrize(("method", "path", "body"), CROSS_TENANT_CALLS)
def test_other_tenants_objects_are_404(make_client, other_tenant, method, path, body) -> None:  # type: ignore[no-untyped-def]
    client_a, _, _ = make_client(slug="tenant-a")
    _, key_b = other_tenant
    data = {"files": [SimpleUploadedFile("adapter_config.json", b"{}")]} if body == "upload" else None
    resp = getattr(client_a, method)(path.format(key_id=key_b.key_id), data, format="multipart" if data else None)
    assert resp.status_code == 404, (path, resp.status_code, resp.content[:200])
    assert resp.json()["code"] in ("not_found", "adapter_not_found")


def test_other_tenants_adapters_are_not_listed(make_client, other_tenant) -> None:  # type: ignore[no-untyped-def]
    client_a, _, _ = make_client(slug="tenant-a")
    assert client_a.get("/api/v1/adapters").json() == []
    assert [k["name"] for k in client_a.get("/api/v1/api-keys").json()] == ["test"]


def test_owner_sees_its_own_objects(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    adapter_create(tenant, name="mine", base_model_name="tiny-llama")
    assert client.get("/api/v1/adapters/mine").status_code == 200
    assert client.get("/api/v1/adapters/mine/versions").status_code == 200


def test_gateway_model_lookup_is_scoped(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client_b, tenant_b, _ = make_client(slug="tenant-b")
    adapter = adapter_create(tenant_b, name="secret-bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant_b, adapter=adapter, number=1, sha256="0" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    client_a, _, _ = make_client(slug="tenant-a")
    assert client_b.get("/v1/models/secret-bot").json()["owned_by"] == "tenant-b"
    resp = client_a.get("/v1/models/secret-bot")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert client_a.get("/v1/models/tiny-llama").status_code == 200
    assert client_a.get("/api/v1/usage").json() == []
