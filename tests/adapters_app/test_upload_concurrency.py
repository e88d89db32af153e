"""Concurrent first uploads to one adapter name agree: one adapter, one version per distinct content."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection

from adapters_app.models import Adapter, AdapterVersion
from adapters_app.services import adapter_version_upload
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _upload(tenant, folder: Path, config_extra: dict) -> tuple[int, bool]:  # type: ignore[no-untyped-def]
    try:
        config = {**json.loads((folder / "adapter_config.json").read_text()), **config_extra}
        files = [SimpleUploadedFile("adapter_config.json", json.dumps(config).encode()),
                 SimpleUploadedFile("adapter_model.safetensors", (folder / "adapter_model.safetensors").read_bytes())]
        version, created = adapter_version_upload(tenant, adapter_name="race", upload_files=files,
                                                  base_model_name="tiny-llama")
        return version.pk, created
    finally:
        connection.close()


def test_parallel_first_uploads(base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    folder = tiny_adapters["qv-r8"]
    with ThreadPoolExecutor(max_workers=6) as pool:
        same = list(pool.map(lambda _: _upload(tenant, folder, {}), range(4)))
        different = list(pool.map(lambda i: _upload(tenant, folder, {"revision": f"r{i}"}), range(3)))
    assert len({pk for pk, _ in same}) == 1 and sum(created for _, created in same) == 1
    assert len({pk for pk, _ in different}) == 3 and all(created for _, created in different)
    assert Adapter.objects.filter(tenant=tenant, name="race").count() == 1
    numbers = sorted(AdapterVersion.objects.filter(adapter__tenant=tenant).values_list("number", flat=True))
    assert numbers == [1, 2, 3, 4]
