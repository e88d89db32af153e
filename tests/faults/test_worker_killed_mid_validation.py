"""Fault injection on real services: SIGKILL the Celery worker's child mid-validation; the version still ends
``ready`` (``acks_late`` + ``reject_on_worker_lost`` redeliver it; the status claim makes the rerun safe).

The worker is a real ``celery worker`` subprocess (prefork, one child) on its own Redis database, so no other test's
worker can take the task. It reads S3 through a TCP relay the test can hold shut: validation then blocks inside its
download, deterministically, while the test kills the child.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_version_upload
from tests.fixtures.faults import TcpRelay, stack_env, worker_process

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def isolated_worker(tmp_path: Path) -> Iterator[tuple[int, TcpRelay, str]]:
    """``(worker pid, S3 relay, broker URL)``: a prefork worker with one child on a private Redis database."""
    s3 = urlsplit(settings.AWS_S3_ENDPOINT_URL or "")
    relay = TcpRelay((s3.hostname or "127.0.0.1", s3.port or 80), hold=True)
    broker = settings.CELERY_BROKER_URL.rsplit("/", 1)[0] + "/7"
    env = stack_env(application_name="faults-sigkill-worker", redis_url=broker,
                    extra={"AWS_S3_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"})
    try:
        with worker_process(env, tmp_path / "worker.log", queues="validation", pool="prefork", concurrency=1) as worker:
            try:
                yield worker.pid, relay, broker
            finally:
                sys.stderr.write(worker.log_tail())
    finally:
        relay.close()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_status(pk: int, statuses: set[str], timeout: float) -> AdapterVersion:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        version = AdapterVersion.objects.get(pk=pk)
        if version.status in statuses:
            return version
        time.sleep(0.05)
    raise AssertionError(f"version {pk} stayed {AdapterVersion.objects.get(pk=pk).status}")


def test_sigkill_mid_validation_still_ends_ready(isolated_worker, make_client, base_model, tiny_adapters,  # type: ignore[no-untyped-def]
                                                 monkeypatch) -> None:
    from adapters_app.tasks import adapter_version_validate_task
    from workers.celery_app import app

    pid, relay, broker = isolated_worker
    # The upload's own enqueue would go to the shared broker; this test sends the task to its private worker.
    monkeypatch.setattr(adapter_version_validate_task, "delay", lambda *a: None)
    _, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    version, _ = adapter_version_upload(tenant, adapter_name="doomed", upload_files=files, base_model_name="tiny-llama")

    with app.connection_for_write(broker) as conn:
        adapter_version_validate_task.apply_async(args=[version.pk], connection=conn)
    _wait_status(version.pk, {"validating"}, 60)  # claimed; its S3 download is now held at the relay
    (child,) = _children(pid)
    os.kill(child, signal.SIGKILL)
    relay.gate.set()

    done = _wait_status(version.pk, {"ready", "rejected"}, 120)
    assert done.status == "ready", done.validation_report
    assert done.validation_attempts == 2  # the killed attempt, then the redelivered one
    assert _children(pid) and _children(pid) != [child]  # the pool replaced its child
