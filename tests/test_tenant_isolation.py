"""Another tenant's object is a 404 on every endpoint, never a 403 (conventions §3), via the reusable matrix."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from django.contrib.auth.models import User

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.gateway.models import UsageRecord
from tenants.models import Tenant
from tenants.services import api_key_create, membership_create
from tests.fixtures.tenancy import UPLOAD, TenantScopedAPITests

pytestmark = pytest.mark.django_db


def _ready_adapter(tenant: Tenant, name: str) -> AdapterVersion:
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    return AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64, size_bytes=1,
                                         s3_prefix="x/", files=[], status="ready")


class TestAdapters(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/adapters/{name}", None),
        ("delete", "/api/v1/adapters/{name}", None),
        ("get", "/api/v1/adapters/{name}/versions", None),
        ("get", "/api/v1/adapters/{name}/versions/1", None),
        ("post", "/api/v1/adapters/{name}/versions", UPLOAD),
    ]
    list_url = "/api/v1/adapters"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        _ready_adapter(tenant, "secret-bot")
        return {"name": "secret-bot"}


class TestApiKeys(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/api-keys/{key_id}", None),
        ("post", "/api/v1/api-keys/{key_id}/revoke", None),
    ]
    list_url = "/api/v1/api-keys"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        key, _ = api_key_create(tenant, name="b-key")
        return {"name": "b-key", "key_id": key.key_id}


class TestGatewayModels(TenantScopedAPITests):
    calls: ClassVar = [("get", "/v1/models/{name}", None)]
    auth_kinds = ("key",)  # the OpenAI-compatible gateway takes API keys only
    list_url = None

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        _ready_adapter(tenant, "secret-bot")
        return {"name": "secret-bot"}

    def test_gateway_list_hides_other_tenants_adapters(self, make_client, base_model) -> None:  # type: ignore[no-untyped-def]
        _, owner, _ = make_client()
        self.make_object(owner)
        intruder, _, _ = make_client()
        ids = [m["id"] for m in intruder.get("/v1/models").json()["data"]]
        assert "secret-bot" not in ids and "tiny-llama" in ids


class TestMembers(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/members/{name}", None),
        ("patch", "/api/v1/members/{name}", {"role": "viewer"}),
        ("delete", "/api/v1/members/{name}", None),
    ]
    list_url = "/api/v1/members"
    list_field = "username"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        user = User.objects.create_user(username=f"alice-{tenant.slug}", password="x")
        membership_create(tenant, user=user, role="member")
        return {"name": user.username}


class TestUsage(TenantScopedAPITests):
    list_url = "/api/v1/usage"
    list_field = "model"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        version = _ready_adapter(tenant, "metered")
        UsageRecord.objects.create(tenant=tenant, adapter_version=version, model_name="metered", version_number=1,
                                   endpoint="completions", status_code=200, prompt_tokens=1, completion_tokens=1,
                                   latency_ms=1.0)
        return {"name": "metered"}
