"""Upload: streamed to S3 with sha256, idempotent, archive or loose files, nothing left behind on failure."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from adapters_app import storage, tasks
from adapters_app.models import AdapterVersion

pytestmark = pytest.mark.django_db


def _files(folder: Path) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()
            and p.name in ("adapter_config.json", "adapter_model.safetensors")]


def _zip(folder: Path, *, arcdir: str = "my-adapter") -> SimpleUploadedFile:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in _files(folder):
            zf.writestr(f"{arcdir}/{f.name}", f.read())
    return SimpleUploadedFile("adapter.zip", buf.getvalue())


def _objects_under(tenant_id: int) -> list[str]:
    return storage.list_keys(f"tenants/{tenant_id}/")


def test_multipart_upload_streams_to_s3_and_records_a_version(make_client, base_model, tiny_adapters, monkeypatch,
                                                              django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    enqueued: list[int] = []
    monkeypatch.setattr(tasks.adapter_version_validate_task, "delay", enqueued.append)
    with django_capture_on_commit_callbacks() as callbacks:
        resp = client.post("/api/v1/adapters/support-bot/versions",
                           {"files": _files(folder), "base_model": "tiny-llama"}, format="multipart")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["number"] == 1 and body["status"] == "uploaded"
    assert enqueued == []  # validation is enqueued only once the row is committed...
    for callback in callbacks:
        callback()
    assert len(enqueued) == 1  # ...and exactly once (other callbacks: the gateway's cache invalidations)
    version = AdapterVersion.objects.get(adapter__tenant=tenant, adapter__name="support-bot")
    weights = (folder / "adapter_model.safetensors").read_bytes()
    entry = next(f for f in version.files if f["name"] == "adapter_model.safetensors")
    assert entry["sha256"] == hashlib.sha256(weights).hexdigest() and entry["size"] == len(weights)
    assert sorted(_objects_under(tenant.pk)) == sorted(f["s3_key"] for f in version.files)
    assert "s3_key" not in body["files"][0]


def test_identical_bytes_are_idempotent_and_archive_matches_loose_files(make_client, base_model, tiny_adapters) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    first = client.post("/api/v1/adapters/a1/versions", {"files": _files(folder), "base_model": "tiny-llama"},
                        format="multipart")
    again = client.post("/api/v1/adapters/a1/versions", {"files": [_zip(folder)]}, format="multipart")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["number"] == first.json()["number"] == 1
    assert again.json()["sha256"] == first.json()["sha256"]
    assert AdapterVersion.objects.filter(adapter__tenant=tenant).count() == 1
    assert len(_objects_under(tenant.pk)) == 2  # the duplicate's objects were removed
    other = client.post("/api/v1/adapters/a1/versions", {"files": _files(tiny_adapters["all-r16"])},
                        format="multipart")
    assert other.status_code == 201 and other.json()["number"] == 2


def test_pickle_upload_is_rejected_with_reason_and_leaves_nothing(make_client, base_model, tiny_adapters) -> None:
    client, tenant, _ = make_client()
    config = (tiny_adapters["qv-r8"] / "adapter_config.json").read_bytes()
    files = [SimpleUploadedFile("adapter_config.json", config),
             SimpleUploadedFile("adapter_model.bin", b"\x80\x02}q\x00.")]
    resp = client.post("/api/v1/adapters/pickled/versions", {"files": files, "base_model": "tiny-llama"},
                       format="multipart")
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "pickle_weights"
    assert body["fields"]["status"] == "rejected"
    assert "safetensors" in body["detail"]
    assert not AdapterVersion.objects.filter(adapter__tenant=tenant).exists()
    assert _objects_under(tenant.pk) == []
    assert client.get("/api/v1/adapters/pickled").status_code == 404  # no half-created adapter either


def test_archive_with_path_traversal_is_refused(make_client, base_model) -> None:
    client, tenant, _ = make_client()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"{}"
        info = tarfile.TarInfo("../../etc/adapter_config.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    resp = client.post("/api/v1/adapters/evil/versions",
                       {"files": [SimpleUploadedFile("a.tar.gz", buf.getvalue())], "base_model": "tiny-llama"},
                       format="multipart")
    assert resp.status_code == 400
    assert resp.json()["code"] == "archive_path_traversal"
    assert _objects_under(tenant.pk) == []


def test_size_cap_stops_the_stream_and_cleans_up(make_client, base_model, tiny_adapters) -> None:
    client, tenant, _ = make_client()
    files = _files(tiny_adapters["qv-r8"])
    with override_settings(QUIVER_MAX_UPLOAD_BYTES=4096):
        resp = client.post("/api/v1/adapters/big/versions", {"files": files, "base_model": "tiny-llama"},
                           format="multipart")
    assert resp.status_code == 413
    assert resp.json()["code"] == "upload_too_large"
    assert _objects_under(tenant.pk) == [] and not AdapterVersion.objects.exists()


def test_storage_failure_midway_leaves_no_orphan(make_client, base_model, tiny_adapters, monkeypatch) -> None:
    client, tenant, _ = make_client()
    real_put = storage.put_stream
    calls = []

    def flaky_put(key, stream, *, limit):  # type: ignore[no-untyped-def]
        calls.append(key)
        if len(calls) == 2:
            raise OSError("connection reset by S3")
        return real_put(key, stream, limit=limit)

    monkeypatch.setattr(storage, "put_stream", flaky_put)
    with pytest.raises(OSError):
        client.post("/api/v1/adapters/flaky/versions",
                    {"files": _files(tiny_adapters["qv-r8"]), "base_model": "tiny-llama"}, format="multipart")
    assert len(calls) == 2
    assert _objects_under(tenant.pk) == [] and not AdapterVersion.objects.exists()


def test_unknown_adapter_without_base_model_is_404_naming_the_fix(make_client, tiny_adapters) -> None:
    client, _, _ = make_client()
    resp = client.post("/api/v1/adapters/nope/versions", {"files": _files(tiny_adapters["qv-r8"])},
                       format="multipart")
    assert resp.status_code == 404
    assert resp.json()["code"] == "adapter_not_found" and "base_model" in resp.json()["detail"]



def test_deleting_an_adapter_removes_its_objects(make_client, base_model, tiny_adapters,
                                                 django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    client.post("/api/v1/adapters/gone/versions", {"files": _files(tiny_adapters["qv-r8"]), "base_model": "tiny-llama"},
                format="multipart")
    assert len(_objects_under(tenant.pk)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete("/api/v1/adapters/gone").status_code == 204
    assert _objects_under(tenant.pk) == [] and not AdapterVersion.objects.filter(adapter__tenant=tenant).exists()


def test_adapter_names_cannot_shadow_a_base_model(make_client, base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    resp = client.post("/api/v1/adapters/tiny-llama/versions",
                       {"files": _files(tiny_adapters["qv-r8"]), "base_model": "tiny-llama"}, format="multipart")
    assert resp.status_code == 409 and resp.json()["code"] == "adapter_name_reserved"
    assert _objects_under(tenant.pk) == []


def test_bad_adapter_name_is_a_clean_field_error(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    resp = client.post("/api/v1/adapters", {"name": "Bad Name!", "base_model": "tiny-llama"}, format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "invalid" and "{" not in body["detail"]
    assert body["fields"]["name"][0].startswith("Use 1-40 lowercase")


def test_reupload_with_another_base_model_is_refused(make_client, base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    files = _files(tiny_adapters["qv-r8"])
    assert client.post("/api/v1/adapters/b1/versions", {"files": files, "base_model": "tiny-llama"},
                       format="multipart").status_code == 201
    resp = client.post("/api/v1/adapters/b1/versions", {"files": _files(tiny_adapters["all-r16"]),
                                                        "base_model": "other-model"}, format="multipart")
    assert resp.status_code == 409 and resp.json()["code"] == "base_model_mismatch"


def test_only_the_files_the_engine_reads_are_stored(make_client, base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    files = [*_files(tiny_adapters["qv-r8"]), SimpleUploadedFile("README.md", b"# card"),
             SimpleUploadedFile(".DS_Store", b"\0")]
    resp = client.post("/api/v1/adapters/lean/versions", {"files": files, "base_model": "tiny-llama"},
                       format="multipart")
    assert resp.status_code == 201
    assert sorted(f["name"] for f in resp.json()["files"]) == ["adapter_config.json", "adapter_model.safetensors"]
    assert len(_objects_under(tenant.pk)) == 2


def test_a_100_kb_base_model_is_not_echoed_whole(make_client, base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    huge = "m" * 100_000
    resp = client.post("/api/v1/adapters/fresh/versions", {"files": _files(tiny_adapters["qv-r8"]), "base_model": huge},
                       format="multipart")
    body = resp.json()
    assert resp.status_code == 400 and body["code"] == "base_model_not_found"
    assert f"'{'m' * 100}…'" in body["detail"] and len(resp.content) < 2_000
