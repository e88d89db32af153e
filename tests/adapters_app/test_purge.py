"""Nothing stuck, nothing orphaned: durable purges, the validation sweeper, attempt caps, S3 garbage collection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from adapters_app import purge as purge_module
from adapters_app import storage
from adapters_app.models import AdapterVersion, Purge
from adapters_app.purge import (
    purge_node_copy,
    purge_run,
    purges_due,
    s3_orphans_collect,
    sweep,
    versions_stuck,
)
from adapters_app.services import adapter_delete, adapter_version_upload, adapter_version_validate
from inference.fleet.models import Node
from inference.fleet.nodes import node_register
from workers.celery_app import app as celery_app

pytestmark = pytest.mark.django_db


def _upload(tenant: Any, folder: Any, name: str = "bot") -> AdapterVersion:
    files = [SimpleUploadedFile(n, (folder / n).read_bytes()) for n in ("adapter_config.json", "adapter_model.safetensors")]
    version, _ = adapter_version_upload(tenant, adapter_name=name, upload_files=files, base_model_name="tiny-llama")
    return version


def _exists(key: str) -> bool:
    return bool(storage.list_keys(key))


def test_a_delete_while_s3_is_down_finishes_once_s3_is_back(make_client, base_model, tiny_adapters, monkeypatch,
                                                          django_capture_on_commit_callbacks) -> None:
    _, tenant, _ = make_client()
    version = _upload(tenant, tiny_adapters["qv-r8"])
    keys = [f["s3_key"] for f in version.files]

    def down(_keys: Any) -> None:
        raise EndpointConnectionError(endpoint_url="http://s3")

    monkeypatch.setattr(storage, "delete_keys", down)
    with django_capture_on_commit_callbacks(execute=True):
        adapter_delete(tenant, adapter=version.adapter)
    (purge,) = Purge.objects.filter(reason="adapter_deleted", kind="s3")
    assert purge.done_at is None and purge.attempts == 1 and "s3" in purge.last_error
    assert all(_exists(k) for k in keys)
    assert purge.pk not in purges_due()  # backing off
    Purge.objects.filter(pk=purge.pk).update(next_attempt_at=timezone.now())
    monkeypatch.undo()
    assert purge.pk in purges_due() and purge_run(purge.pk)
    assert not any(_exists(k) for k in keys)
    purge.refresh_from_db()
    assert purge.done_at is not None and purge_run(purge.pk)  # done stays done


def test_a_node_purge_waits_for_the_node_and_ends_when_it_is_gone(base_model) -> None:
    node, _ = node_register(name="away", agent_url="http://127.0.0.1:9", engine_url="http://127.0.0.1:9",
                            base_model_name="tiny-llama")
    purge = purge_node_copy(node.pk, "t--a--1", reason="test")
    assert purge is not None and purge_node_copy(node.pk, "t--a--1", reason="test") is None  # one pending per copy
    assert not purge_run(purge.pk)
    purge.refresh_from_db()
    assert purge.attempts == 1 and purge.next_attempt_at > timezone.now() + timedelta(seconds=5)
    Node.objects.filter(pk=node.pk).delete()
    assert purge_run(purge.pk)


def test_an_orphan_copy_purge_is_dropped_once_a_version_owns_the_name_again(make_client, base_model, tiny_adapters,
                                                                            monkeypatch) -> None:
    """A node's disk older than the database (restored or reset) reports a name no version owns yet; by the time the
    purge runs, a new version carries that very name and serves it: the purge must not pull it from the engine."""
    _, tenant, _ = make_client()
    node, _ = node_register(name="n1", agent_url="http://127.0.0.1:9", engine_url="http://127.0.0.1:9",
                            base_model_name="tiny-llama")
    version = _upload(tenant, tiny_adapters["qv-r8"])
    drops: list[str] = []
    monkeypatch.setattr(purge_module, "fleet_port", lambda: type("P", (), {
        "node_copy_drop": staticmethod(lambda node_id, name: drops.append(name))})())
    owned = purge_node_copy(node.pk, version.served_name, reason=purge_module.GC_ORPHAN_COPY)
    stray = purge_node_copy(node.pk, f"{tenant.slug}--gone--{version.pk + 1000}", reason=purge_module.GC_ORPHAN_COPY)
    deleted = purge_node_copy(node.pk, version.served_name + "x", reason="adapter_deleted")
    assert owned and stray and deleted
    assert purge_run(owned.pk) and purge_run(stray.pk) and purge_run(deleted.pk)
    assert drops == [stray.lora_name, deleted.lora_name]  # the owned name is left alone, the rest dropped


def test_the_sweeper_requeues_stuck_versions_only(make_client, base_model, tiny_adapters) -> None:
    _, tenant, _ = make_client()
    lost_enqueue = _upload(tenant, tiny_adapters["qv-r8"], "lost")
    dead_worker = _upload(tenant, tiny_adapters["all-r16"], "dead")
    fresh = _upload(tenant, tiny_adapters["qv-r8"], "fresh")
    long_ago = timezone.now() - timedelta(hours=1)
    AdapterVersion.objects.filter(pk=lost_enqueue.pk).update(created_at=long_ago)
    AdapterVersion.objects.filter(pk=dead_worker.pk).update(status="validating", validation_claimed_at=long_ago)
    stuck = versions_stuck()
    assert lost_enqueue.pk in stuck and dead_worker.pk in stuck and fresh.pk not in stuck
    sent: list[int] = []
    assert sweep(sent.append) == len(stuck) and lost_enqueue.pk in sent
    adapter_version_validate(AdapterVersion.objects.get(pk=dead_worker.pk))
    assert dead_worker.pk not in versions_stuck()  # finished: ready or rejected


def test_a_version_that_keeps_killing_workers_is_rejected(make_client, base_model, tiny_adapters, settings) -> None:
    _, tenant, _ = make_client()
    version = _upload(tenant, tiny_adapters["qv-r8"])
    AdapterVersion.objects.filter(pk=version.pk).update(status="validating",
                                                        validation_attempts=settings.QUIVER_VALIDATION_MAX_ATTEMPTS)
    version = adapter_version_validate(AdapterVersion.objects.get(pk=version.pk))
    assert version.status == "rejected"
    assert version.validation_report["problems"][0]["code"] == "validation_crashed"


def test_worker_loss_requeues_validation() -> None:
    assert celery_app.conf.task_reject_on_worker_lost is True
    task = celery_app.tasks["adapters_app.tasks.adapter_version_validate_task"]
    assert task.acks_late and task.reject_on_worker_lost


def test_orphaned_s3_objects_are_collected_and_referenced_ones_kept(make_client, base_model, tiny_adapters,
                                                                 django_capture_on_commit_callbacks) -> None:
    _, tenant, _ = make_client()
    version = _upload(tenant, tiny_adapters["qv-r8"])
    orphan = f"tenants/{tenant.pk}/uploads/deadbeef/adapter_model.safetensors"
    storage.s3_client().put_object(Bucket=storage.settings.AWS_STORAGE_BUCKET_NAME, Key=orphan, Body=b"x")
    with django_capture_on_commit_callbacks(execute=True):
        collected = s3_orphans_collect(grace_s=0)
    assert collected >= 1 and not _exists(orphan)
    assert all(_exists(f["s3_key"]) for f in version.files)


def test_gc_leaves_objects_younger_than_the_grace_period(make_client, django_capture_on_commit_callbacks) -> None:
    _, tenant, _ = make_client()
    young = f"tenants/{tenant.pk}/uploads/cafe/adapter_config.json"
    storage.s3_client().put_object(Bucket=storage.settings.AWS_STORAGE_BUCKET_NAME, Key=young, Body=b"{}")
    with django_capture_on_commit_callbacks(execute=True):
        purge_module.s3_orphans_collect(grace_s=3600)  # an upload in flight looks like this
    assert _exists(young)
