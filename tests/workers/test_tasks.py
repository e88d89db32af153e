"""Celery tasks run eagerly: idempotent on gone rows, bounded retries that never strand a version."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError
from django.core.files.uploadedfile import SimpleUploadedFile

from adapters_app import services as adapter_services
from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_version_upload
from adapters_app.tasks import VALIDATE_RETRIES, adapter_version_validate_task
from inference.fleet.tasks import placement_warm_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(make_client, base_model, tiny_adapters) -> AdapterVersion:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    folder: Path = tiny_adapters["qv-r8"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    return adapter_version_upload(tenant, adapter_name="t", upload_files=files, base_model_name="tiny-llama")[0]


def test_tasks_return_early_when_the_row_is_gone() -> None:
    adapter_version_validate_task.apply(args=[987654321]).get()
    placement_warm_task.apply(args=[987654321]).get()


def test_validation_runs_once_per_version(version: AdapterVersion) -> None:
    adapter_version_validate_task.apply(args=[version.pk]).get()
    version.refresh_from_db()
    first = (version.status, version.validated_at)
    adapter_version_validate_task.apply(args=[version.pk]).get()
    version.refresh_from_db()
    assert first == (version.status, version.validated_at) and version.status == "ready"


def test_storage_outage_ends_rejected_after_bounded_retries(version: AdapterVersion, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def down(*args: object, **kwargs: object) -> str:
        raise EndpointConnectionError(endpoint_url="http://s3")

    monkeypatch.setattr(adapter_services.storage, "download_to", down)
    result = adapter_version_validate_task.apply(args=[version.pk], retries=VALIDATE_RETRIES)
    assert result.successful()
    version.refresh_from_db()
    assert version.status == "rejected"
    assert version.validation_report["problems"][0]["code"] == "validation_unavailable"


def test_reuploading_a_rejected_version_validates_it_again(version: AdapterVersion, base_model, tiny_adapters,  # type: ignore[no-untyped-def]
                                                           django_capture_on_commit_callbacks) -> None:
    adapter_services.adapter_version_fail(version, code="validation_unavailable", message="m", hint="h")
    folder: Path = tiny_adapters["qv-r8"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    with django_capture_on_commit_callbacks() as callbacks:
        again, created = adapter_version_upload(version.tenant, adapter_name="t", upload_files=files)
    assert not created and again.pk == version.pk and again.status == "uploaded"
    assert len(callbacks) == 1
