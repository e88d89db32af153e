"""Per-tenant abuse limits: adapters, versions per adapter, stored bytes, API keys — refused clearly, race-free."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection

from adapters_app import storage
from adapters_app.models import Adapter
from adapters_app.services import adapter_create
from common.exceptions import QuiverError
from tenants.models import Tenant
from tenants.services import api_key_create, api_key_revoke
from tests.factories import TenantFactory


def _files(folder: Any) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]


@pytest.mark.django_db(transaction=True)
def test_the_last_adapter_slot_goes_to_exactly_one_of_many_concurrent_creates(base_model) -> None:
    tenant = TenantFactory(max_adapters=1)
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def create(i: int) -> None:
        try:
            barrier.wait()
            adapter_create(tenant, name=f"a{i}", base_model_name="tiny-llama")
            outcomes.append("created")
        except QuiverError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] + ["quota_exceeded"] * 5
    assert Adapter.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db
def test_versions_per_adapter_and_stored_bytes_are_capped_leaving_nothing(make_client, base_model,
                                                                         tiny_adapters) -> None:
    client, tenant, _ = make_client()
    Tenant.objects.filter(pk=tenant.pk).update(max_versions_per_adapter=1)
    url = "/api/v1/adapters/bot/versions"
    assert client.post(url, {"files": _files(tiny_adapters["qv-r8"]), "base_model": "tiny-llama"},
                       format="multipart").status_code == 201
    before = storage.list_keys(f"tenants/{tenant.pk}/")
    resp = client.post(url, {"files": _files(tiny_adapters["all-r16"])}, format="multipart")
    assert resp.status_code == 403 and resp.json()["code"] == "quota_exceeded"
    assert "max_versions_per_adapter" in resp.json()["detail"]
    assert storage.list_keys(f"tenants/{tenant.pk}/") == before

    Tenant.objects.filter(pk=tenant.pk).update(max_versions_per_adapter=10, max_stored_bytes=1000)
    resp = client.post("/api/v1/adapters/other/versions", {"files": _files(tiny_adapters["all-r16"]),
                                                           "base_model": "tiny-llama"}, format="multipart")
    assert resp.status_code == 403 and "max_stored_bytes" in resp.json()["detail"]
    assert storage.list_keys(f"tenants/{tenant.pk}/") == before


@pytest.mark.django_db
def test_active_api_keys_are_capped() -> None:
    tenant = TenantFactory(max_api_keys=2)
    first, _ = api_key_create(tenant, name="a")
    api_key_create(tenant, name="b")
    with pytest.raises(QuiverError, match="max_api_keys") as info:
        api_key_create(tenant, name="c")
    assert info.value.status_code == 403
    api_key_revoke(tenant, key_id=first.key_id)
    assert api_key_create(tenant, name="c")[0].name == "c"
