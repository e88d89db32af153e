"""Fault injection on real services: SIGKILL the Celery worker's child mid-validation; the version still ends
``ready`` (``acks_late`` + ``reject_on_worker_lost`` redeliver it; the status claim makes the rerun safe).

The worker is a real ``celery worker`` subprocess (prefork, one child) on its own Redis database, so no other test's
worker can take the task. It reads S3 through a TCP relay the test can hold shut: validation then blocks inside its
download, deterministically, while the test kills the child.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_version_upload
from devtools.proc import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


class HeldRelay:
    """A TCP relay to ``target`` whose upstream → client direction waits while ``gate`` is clear."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.gate = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, held: bool) -> None:
        try:
            while data := src.recv(65536):
                if held:
                    self.gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped = True
        self.gate.set()
        self.server.close()


def _database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture
def isolated_worker(tmp_path: Path) -> Iterator[tuple[int, HeldRelay, str]]:
    """``(worker pid, S3 relay, broker URL)``: a prefork worker with one child on a private Redis database."""
    s3 = urlsplit(settings.AWS_S3_ENDPOINT_URL or "")
    relay = HeldRelay((s3.hostname or "127.0.0.1", s3.port or 80))
    broker = settings.CELERY_BROKER_URL.rsplit("/", 1)[0] + "/7"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "DATABASE_URL": _database_url(),
           "CELERY_BROKER_URL": broker, "REDIS_URL": broker,
           "AWS_S3_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=prefork", "--concurrency=1",
             "-Q", "validation", "--without-heartbeat", "--without-mingle", "--without-gossip",
             "--hostname", f"faults-{free_port()}@localhost", "--loglevel=INFO"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"ready." not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield proc.pid, relay, broker
    except BaseException:
        sys.stderr.write(log.read_text(errors="replace")[-4000:])
        raise
    finally:
        sys.stderr.write(log.read_text(errors="replace")[-3000:])
        relay.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
    import adapters_app.services
    from adapters_app.tasks import adapter_version_validate_task
    from config.celery_app import app

    pid, relay, broker = isolated_worker
    # The upload's own enqueue would go to the shared broker; this test sends the task to its private worker.
    monkeypatch.setattr(adapters_app.services, "adapter_version_validate_task", SimpleNamespace(delay=lambda *a: None))
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
