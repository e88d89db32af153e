"""Broker down at commit: writes that committed answer success, and the durable row lets beat finish the work.

The broker is replaced by one that refuses connections (kombu's OperationalError, what a stopped Redis gives).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from kombu.exceptions import OperationalError

from adapters_app import tasks as adapter_tasks
from adapters_app.models import Adapter, AdapterVersion
from adapters_app.purge import versions_stuck
from inference.fleet import tasks as fleet_tasks

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit runs inside the request, as in production


@pytest.fixture
def broker_down(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    refused: list[str] = []

    def refuse(name: str) -> Any:
        def delay(*args: Any) -> None:
            refused.append(name)
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return delay

    for module, name in ((adapter_tasks, "adapter_version_validate_task"), (adapter_tasks, "purge_run_task"),
                         (fleet_tasks, "placement_warm_task"), (fleet_tasks, "placement_evict_task")):
        monkeypatch.setattr(getattr(module, name), "delay", refuse(name))
    return refused


def _files(folder: Path) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]


def test_upload_and_delete_succeed_with_the_broker_down(make_client: Any, base_model: Any, tiny_adapters: Any,
                                                        broker_down: list[str], settings: Any) -> None:
    client, tenant, _ = make_client()
    resp = client.post("/api/v1/adapters/bot/versions", {"files": _files(tiny_adapters["qv-r8"]),
                                                         "base_model": "tiny-llama"}, format="multipart")
    assert resp.status_code == 201, resp.content
    assert broker_down == ["adapter_version_validate_task"]
    version = AdapterVersion.objects.get(adapter__tenant=tenant)
    settings.QUIVER_SWEEP_UPLOADED_AFTER_S = 0
    assert version.pk in versions_stuck()  # the sweeper re-sends it once the broker is back

    resp = client.delete("/api/v1/adapters/bot")
    assert resp.status_code == 204, resp.content
    assert not Adapter.objects.filter(tenant=tenant).exists()
