"""A key limited to some adapters (``ApiKey.adapters``) reaches only those on the management API: the tenant's
other adapters, their versions, uploads, usage and the keys that name them are 404s or absent, as if they did not
exist, and it cannot create an adapter outside its list (fresh-user finding: a key made with ``--adapter`` deleted,
uploaded to and read the tenant's other adapters)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from adapters_app.models import Adapter, AdapterVersion
from adapters_app.services import adapter_create
from inference.metering.models import UsageRecord
from tenants.services import api_key_create

pytestmark = pytest.mark.django_db


def _client(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def test_a_key_limited_to_one_adapter_reaches_only_it(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    owner, tenant, _ = make_client()
    mine = adapter_create(tenant, name="mine", base_model_name="tiny-llama")
    other = adapter_create(tenant, name="other", base_model_name="tiny-llama")
    for adapter in (mine, other):
        version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64,
                                                size_bytes=1, s3_prefix="x/", files=[], status="ready")
        UsageRecord.objects.create(tenant=tenant, adapter_version=version, base_model=base_model,
                                   model_name=adapter.name, version_number=1, endpoint="completions", status_code=200,
                                   prompt_tokens=1, completion_tokens=2, latency_ms=1.0)
    UsageRecord.objects.create(tenant=tenant, base_model=base_model, model_name="tiny-llama", endpoint="completions",
                               status_code=200, prompt_tokens=3, completion_tokens=4, latency_ms=1.0)
    _, plaintext = api_key_create(tenant, name="limited", adapters=["mine"])
    api_key_create(tenant, name="for-other", adapters=["other"])
    limited = _client(plaintext)

    assert [a["name"] for a in limited.get("/api/v1/adapters").json()] == ["mine"]
    assert limited.get("/api/v1/adapters/mine").status_code == 200
    assert limited.get("/api/v1/adapters/mine/versions/1").status_code == 200
    for path in ("/api/v1/adapters/other", "/api/v1/adapters/other/versions", "/api/v1/adapters/other/versions/1",
                 "/api/v1/adapters/other/serving", "/api/v1/usage/versions?adapter=other"):
        assert limited.get(path).status_code == 404, path
    assert limited.delete("/api/v1/adapters/other").status_code == 404
    assert Adapter.objects.filter(tenant=tenant, name="other").exists()

    upload = {"files": [SimpleUploadedFile("adapter_config.json", b"{}")], "base_model": "tiny-llama"}
    for name in ("other", "brand-new"):  # an existing adapter and a new one: the same 404, nothing written
        assert limited.post(f"/api/v1/adapters/{name}/versions", upload, format="multipart").status_code == 404
        declared = limited.post(f"/api/v1/adapters/{name}/uploads", {
            "base_model": "tiny-llama", "files": [{"name": "adapter_config.json", "size": 2, "sha256": "0" * 64}]},
            format="json")
        assert declared.status_code == 404, declared.content
    assert limited.post("/api/v1/adapters", {"name": "brand-new", "base_model": "tiny-llama"},
                        format="json").status_code == 404
    assert not Adapter.objects.filter(tenant=tenant, name="brand-new").exists()
    assert AdapterVersion.objects.filter(adapter=other).count() == 1

    assert [row["model"] for row in limited.get("/api/v1/usage").json()] == ["mine"]
    assert {row["model"] for row in owner.get("/api/v1/usage").json()} == {"mine", "other", "tiny-llama"}
    assert sorted(k["name"] for k in limited.get("/api/v1/api-keys").json()) == ["limited"]
    assert len(owner.get("/api/v1/api-keys").json()) == 3


def test_a_key_for_adapters_not_uploaded_yet_is_made_and_the_answer_names_them(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    """A key may name adapters before their first upload (it may create them itself), so unknown names are no 400;
    but a typo made a key that 404s everything in silence: the answer lists them, another tenant's included."""
    owner, tenant, _ = make_client()
    mine = adapter_create(tenant, name="mine", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=mine, number=1, sha256="0" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    _, elsewhere, _ = make_client()
    adapter_create(elsewhere, name="theirs", base_model_name="tiny-llama")

    made = owner.post("/api/v1/api-keys", {"name": "bot", "scopes": ["inference"],
                                            "adapters": ["mine", "mine@1", "mine@2", "typo-bot", "theirs"]},
                      format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["adapters"] == ["mine", "mine@1", "mine@2", "theirs", "typo-bot"]
    assert body["adapters_not_found"] == ["mine@2", "theirs", "typo-bot"]
    assert body["warning"].startswith("No adapter or version mine@2, theirs, typo-bot exists yet.")

    clean = owner.post("/api/v1/api-keys", {"name": "ok", "adapters": ["mine@1"]}, format="json").json()
    assert (clean["adapters_not_found"], clean["warning"]) == ([], None)
    unscoped = owner.post("/api/v1/api-keys", {"name": "all"}, format="json").json()
    assert (unscoped["adapters_not_found"], unscoped["warning"]) == ([], None)
