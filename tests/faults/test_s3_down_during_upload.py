"""Fault injection on real services: S3 goes away in the middle of an upload → 503, no version, and the object
already written is collected once S3 is back (nothing orphaned)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from adapters_app import storage
from adapters_app.models import AdapterVersion
from adapters_app.purge import s3_orphans_collect
from tests.fixtures.faults import TcpRelay

pytestmark = pytest.mark.django_db


def test_s3_down_mid_upload_answers_503_and_leaves_nothing(make_client, base_model, tiny_adapters,  # type: ignore[no-untyped-def]
                                                           django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    s3 = urlsplit(settings.AWS_S3_ENDPOINT_URL or "")
    relay = TcpRelay((s3.hostname or "127.0.0.1", s3.port or 80), cut_after=4096)  # after adapter_config.json
    storage.s3_client.cache_clear()
    try:
        with override_settings(AWS_S3_ENDPOINT_URL=f"http://127.0.0.1:{relay.port}"):
            resp = client.post("/api/v1/adapters/cut/versions", {"files": files, "base_model": "tiny-llama"},
                               format="multipart")
    finally:
        storage.s3_client.cache_clear()
    assert relay.dead.is_set()
    assert resp.status_code == 503 and resp.json()["code"] == "storage_unavailable", resp.content[:300]
    assert not AdapterVersion.objects.filter(adapter__tenant=tenant).exists()
    # S3 is back (the real endpoint): whatever the failed cleanup could not delete is garbage-collected.
    with django_capture_on_commit_callbacks(execute=True):
        s3_orphans_collect(grace_s=0)
    assert storage.list_keys(f"tenants/{tenant.pk}/") == []
