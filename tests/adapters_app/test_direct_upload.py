"""Browser-direct uploads against the real S3 server: presigned parts, server-side completion, sha256 checked by the
worker step before a version exists, and an attacker's view of every step."""

from __future__ import annotations

import hashlib
import io
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import override_settings
from django.utils import timezone

from adapters_app import direct_upload, storage
from adapters_app.models import AdapterVersion, Upload

pytestmark = pytest.mark.django_db
SERVED = ("adapter_config.json", "adapter_model.safetensors")


def _declare(folder: Path, **overrides: str) -> list[dict[str, Any]]:
    out = []
    for name in SERVED:
        data = (folder / name).read_bytes()
        out.append({"name": name, "size": len(data), "sha256": overrides.get(name, hashlib.sha256(data).hexdigest())})
    return out


def _base(name: str = "capitals") -> str:
    return f"/api/v1/adapters/{name}/uploads"


def _put_parts(client: Any, url: str, name: str, data: bytes, part_size: int,
               urls: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """What the browser does: take the part URLs (from the create response, or sign them), PUT each part straight
    to S3, keep the ETags."""
    count = direct_upload.part_count(len(data), part_size)
    if urls is None:
        signed = client.post(f"{url}/sign", {"name": name, "part_numbers": list(range(1, count + 1))}, format="json")
        assert signed.status_code == 200, signed.json()
        urls = signed.json()["urls"]
    parts = []
    for n in range(1, count + 1):
        resp = httpx.put(urls[str(n)], content=data[(n - 1) * part_size : n * part_size])
        assert resp.status_code == 200, resp.text
        parts.append({"PartNumber": n, "ETag": resp.headers["etag"]})
    return parts


def _upload_all(client: Any, folder: Path, adapter: str = "capitals") -> dict[str, Any]:
    created = client.post(_base(adapter), {"files": _declare(folder), "base_model": "tiny-llama"}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    url = f"{_base(adapter)}/{body['id']}"
    for name in SERVED:
        parts = _put_parts(client, url, name, (folder / name).read_bytes(), body["part_size"], body["part_urls"][name])
        done = client.post(f"{url}/complete", {"name": name, "parts": parts}, format="json")
        assert done.status_code == 200, done.json()
    return done.json()


@pytest.fixture
def no_enqueue(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capture the worker enqueues instead of sending them (the worker step is run in the test)."""
    from adapters_app import tasks

    sent: list[int] = []
    monkeypatch.setattr(tasks.upload_verify_task, "delay", sent.append)
    monkeypatch.setattr(tasks.adapter_version_validate_task, "delay", lambda pk: None)
    return sent


def test_parts_go_straight_to_s3_the_server_completes_and_the_worker_checks_sha256(
        make_client, base_model, tiny_adapters, no_enqueue, django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    with django_capture_on_commit_callbacks(execute=True):
        body = _upload_all(client, folder)
    assert body["state"] == "verifying" and body["version"] is None
    upload = Upload.objects.get(public_id=body["id"])
    assert no_enqueue == [upload.pk]  # the verification is enqueued once, after the last file
    assert not AdapterVersion.objects.filter(tenant=tenant).exists()  # nothing is a version before the sha256 check
    with django_capture_on_commit_callbacks(execute=True):
        direct_upload.upload_verify(upload.pk)
    shown = client.get(f"{_base()}/{body['id']}").json()
    assert shown["state"] == "done" and shown["version"] == 1
    version = AdapterVersion.objects.get(tenant=tenant, adapter__name="capitals")
    assert version.status == "uploaded" and {f["sha256"] for f in version.files} == {f["sha256"] for f in _declare(folder)}
    assert all(f["s3_key"].startswith(f"tenants/{tenant.pk}/uploads/{body['id']}/") for f in version.files)
    assert storage.multipart_uploads(f"tenants/{tenant.pk}/") == []


def test_bytes_that_do_not_match_their_sha256_never_become_a_version(
        make_client, base_model, tiny_adapters, no_enqueue, django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    declared = _declare(folder, **{"adapter_model.safetensors": "0" * 64})
    created = client.post(_base(), {"files": declared, "base_model": "tiny-llama"}, format="json").json()
    url = f"{_base()}/{created['id']}"
    with django_capture_on_commit_callbacks(execute=True):
        for name in SERVED:
            _put_parts(client, url, name, (folder / name).read_bytes(), created["part_size"])
            assert client.post(f"{url}/complete", {"name": name}, format="json").status_code == 200
        direct_upload.upload_verify(Upload.objects.get(public_id=created["id"]).pk)
    shown = client.get(url).json()
    assert shown["state"] == "failed" and shown["error"]["code"] == "sha256_mismatch"
    assert "adapter_model.safetensors" in shown["error"]["detail"]
    assert not AdapterVersion.objects.filter(tenant=tenant).exists()
    assert storage.list_keys(f"tenants/{tenant.pk}/") == []  # the objects are gone


def test_a_part_cannot_carry_more_bytes_than_declared(make_client, base_model, no_enqueue,
                                                       django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    config = b'{"peft_type": "LORA"}'
    files = [{"name": "adapter_config.json", "size": len(config), "sha256": hashlib.sha256(config).hexdigest()},
             {"name": "adapter_model.safetensors", "size": 10, "sha256": "1" * 64}]
    created = client.post(_base(), {"files": files, "base_model": "tiny-llama"}, format="json").json()
    url = f"{_base()}/{created['id']}"
    signed = client.post(f"{url}/sign", {"name": "adapter_model.safetensors", "part_numbers": [1]}, format="json")
    part_url = signed.json()["urls"]["1"]
    assert httpx.put(part_url, content=b"x" * (50 * 1024 * 1024)).status_code == 403  # signed Content-Length
    refused = client.post(f"{url}/sign", {"name": "adapter_model.safetensors", "part_numbers": [2]}, format="json")
    assert refused.status_code == 400 and "outside 1..1" in refused.json()["detail"]
    incomplete = client.post(f"{url}/complete", {"name": "adapter_model.safetensors"}, format="json")
    assert incomplete.status_code == 400 and incomplete.json()["code"] == "upload_incomplete"
    # The S3 API itself (no presigned URL) would take a bigger part: completion then refuses and discards it all.
    upload = Upload.objects.get(public_id=created["id"])
    entry = next(f for f in upload.files if f["name"] == "adapter_model.safetensors")
    storage.s3_client().upload_part(Bucket=storage.settings.AWS_STORAGE_BUCKET_NAME, Key=entry["key"],
                                    UploadId=entry["upload_id"], PartNumber=1, Body=b"y" * 11)
    with django_capture_on_commit_callbacks(execute=True):
        bigger = client.post(f"{url}/complete", {"name": "adapter_model.safetensors"}, format="json")
    assert bigger.status_code == 400 and bigger.json()["code"] == "upload_size_mismatch"
    assert client.get(url).json()["state"] == "failed"
    assert storage.multipart_uploads(f"tenants/{tenant.pk}/") == [] and storage.list_keys(f"tenants/{tenant.pk}/") == []
    assert no_enqueue == []


@override_settings(QUIVER_UPLOAD_PART_BYTES=5 * 1024 * 1024, QUIVER_MAX_UPLOAD_BYTES=1 << 30)
def test_the_create_response_signs_the_first_100_parts_of_each_file_and_sign_the_rest(make_client, base_model) -> None:
    client, _, _ = make_client()
    part = 5 * 1024 * 1024
    big = {"name": "adapter_model.safetensors", "size": 120 * part - 7, "sha256": "0" * 64}
    small = {"name": "adapter_config.json", "size": 10, "sha256": "1" * 64}
    created = client.post(_base(), {"files": [small, big], "base_model": "tiny-llama"}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["expires_in"] > 0
    assert sorted(body["part_urls"]["adapter_config.json"]) == ["1"]
    urls = body["part_urls"]["adapter_model.safetensors"]
    assert sorted(map(int, urls)) == list(range(1, 101))
    assert httpx.put(urls["1"], content=b"x" * (part - 1)).status_code == 403  # the part's own length is signed
    assert httpx.put(urls["1"], content=b"x" * part).status_code == 200
    rest = client.post(f"{_base()}/{body['id']}/sign", {"name": big["name"], "part_numbers": list(range(101, 121))},
                       format="json")
    assert rest.status_code == 200 and sorted(map(int, rest.json()["urls"])) == list(range(101, 121))
    assert "part_urls" not in client.get(f"{_base()}/{body['id']}").json()  # only the create response signs


@pytest.mark.parametrize("name", ["../adapter_config.json", "a/adapter_config.json", "tenants\\1", ""])
def test_a_file_name_cannot_point_a_key_outside_the_tenants_prefix(make_client, base_model, name) -> None:
    client, tenant, _ = make_client()
    files = [{"name": name, "size": 5, "sha256": "a" * 64},
             {"name": "adapter_model.safetensors", "size": 5, "sha256": "b" * 64}]
    resp = client.post(_base(), {"files": files, "base_model": "tiny-llama"}, format="json")
    assert resp.status_code == 400, resp.json()
    assert not Upload.objects.filter(tenant=tenant).exists()


def test_caps_and_quota_are_checked_before_anything_reaches_s3(make_client, base_model) -> None:
    client, tenant, _ = make_client()
    tenant.max_stored_bytes = 1000
    tenant.save()
    files = [{"name": "adapter_config.json", "size": 100, "sha256": "a" * 64},
             {"name": "adapter_model.safetensors", "size": 800, "sha256": "b" * 64}]
    assert client.post(_base(), {"files": files, "base_model": "tiny-llama"}, format="json").status_code == 201
    # Bytes of an upload still in flight count: a second one would pass the quota.
    again = client.post(_base("other"), {"files": files, "base_model": "tiny-llama"}, format="json")
    assert again.status_code == 403 and again.json()["code"] == "quota_exceeded"
    with override_settings(QUIVER_MAX_UPLOAD_BYTES=500):
        big = client.post(_base("third"), {"files": files, "base_model": "tiny-llama"}, format="json")
    assert big.status_code == 413 and big.json()["code"] == "upload_too_large"
    extra = client.post(_base("fourth"), {"files": [*files, {"name": "README.md", "size": 1, "sha256": "c" * 64}],
                                          "base_model": "tiny-llama"}, format="json")
    assert extra.status_code == 400 and extra.json()["code"] == "upload_unserved_file"
    assert Upload.objects.filter(tenant=tenant).count() == 1
    assert len(storage.multipart_uploads(f"tenants/{tenant.pk}/")) == 2  # only the first upload's two files


def test_cancel_and_the_sweeper_leave_nothing_in_s3(make_client, base_model, tiny_adapters,
                                                    django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    prefix = f"tenants/{tenant.pk}/"
    created = client.post(_base(), {"files": _declare(folder), "base_model": "tiny-llama"}, format="json").json()
    url = f"{_base()}/{created['id']}"
    with django_capture_on_commit_callbacks(execute=True):
        _put_parts(client, url, "adapter_config.json", (folder / "adapter_config.json").read_bytes(), created["part_size"])
        assert client.post(f"{url}/complete", {"name": "adapter_config.json"}, format="json").status_code == 200
        assert client.post(f"{url}/abort").json()["state"] == "aborted"
    assert storage.multipart_uploads(prefix) == [] and storage.list_keys(prefix) == []
    assert client.post(f"{url}/sign", {"name": "adapter_model.safetensors", "part_numbers": [1]},
                       format="json").status_code == 409
    # Abandoned: left open past its lifetime, swept.
    left = client.post(_base(), {"files": _declare(folder), "base_model": "tiny-llama"}, format="json").json()
    Upload.objects.filter(public_id=left["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    # And a multipart upload no row owns (the web process died between S3 and the database).
    storage.multipart_create(prefix + "uploads/crashed/adapter_model.safetensors")
    with override_settings(QUIVER_GC_GRACE_S=0), django_capture_on_commit_callbacks(execute=True):
        swept = direct_upload.uploads_sweep(now=timezone.now() + timedelta(seconds=1))
    assert swept["expired"] == 1 and swept["orphans"] >= 1
    assert client.get(f"{_base()}/{left['id']}").json()["error"]["code"] == "upload_expired"
    assert storage.multipart_uploads(prefix) == [] and storage.list_keys(prefix) == []


def test_an_archive_is_unpacked_by_the_worker(make_client, base_model, tiny_adapters, no_enqueue,
                                              django_capture_on_commit_callbacks) -> None:
    client, tenant, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in SERVED:
            zf.writestr(f"my-adapter/{name}", (folder / name).read_bytes())
    data = buf.getvalue()
    files = [{"name": "adapter.zip", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    created = client.post(_base(), {"files": files, "base_model": "tiny-llama"}, format="json").json()
    url = f"{_base()}/{created['id']}"
    with django_capture_on_commit_callbacks(execute=True):
        _put_parts(client, url, "adapter.zip", data, created["part_size"])
        assert client.post(f"{url}/complete", {"name": "adapter.zip"}, format="json").json()["state"] == "verifying"
        direct_upload.upload_verify(Upload.objects.get(public_id=created["id"]).pk)
    version = AdapterVersion.objects.get(tenant=tenant)
    assert {f["name"] for f in version.files} == set(SERVED)
    assert sorted(storage.list_keys(f"tenants/{tenant.pk}/")) == sorted(f["s3_key"] for f in version.files)


def test_uppy_speaks_s3_xml_to_the_complete_and_parts_endpoints(make_client, base_model, tiny_adapters,
                                                                no_enqueue) -> None:
    client, _, _ = make_client()
    folder = tiny_adapters["qv-r8"]
    created = client.post(_base(), {"files": _declare(folder), "base_model": "tiny-llama"}, format="json").json()
    url = f"{_base()}/{created['id']}"
    data = (folder / "adapter_config.json").read_bytes()
    parts = _put_parts(client, url, "adapter_config.json", data, created["part_size"])
    listed = client.get(f"{url}/parts?name=adapter_config.json&dialect=s3")
    assert listed["Content-Type"] == "application/xml" and b"<PartNumber>1</PartNumber>" in listed.content
    xml = "<CompleteMultipartUpload>" + "".join(
        f"<Part><PartNumber>{p['PartNumber']}</PartNumber><ETag>{p['ETag']}</ETag></Part>" for p in parts
    ) + "</CompleteMultipartUpload>"
    done = client.post(f"{url}/complete?name=adapter_config.json&dialect=s3", xml, content_type="application/xml")
    assert done.status_code == 200 and b"<Key>adapter_config.json</Key>" in done.content
    wrong = client.post(f"{url}/complete?name=adapter_model.safetensors", "<!DOCTYPE x><CompleteMultipartUpload/>",
                        content_type="application/xml")
    assert wrong.status_code == 400


def test_the_start_up_warm_up_of_s3_calls_makes_no_network_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # config.asgi runs it at start: it must neither need S3 up nor send anything.
    from botocore.httpsession import URLLib3Session

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("warm_up sent a request")

    monkeypatch.setattr(URLLib3Session, "send", refuse)
    storage.warm_up()
    with pytest.raises(AssertionError, match="sent a request"):
        storage.multipart_parts("warm-up", "warm-up")  # the guard would catch a real call


def test_direct_upload_errors_quote_at_most_100_characters_of_a_value(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    unknown = "m" * 150  # the serializer lets up to 200 characters through
    files = [{"name": n, "size": 1, "sha256": "0" * 64} for n in ("adapter_config.json", "adapter_model.safetensors")]
    resp = client.post(_base(), {"files": files, "base_model": unknown}, format="json")
    detail = resp.json()["detail"]
    assert resp.status_code == 400 and "m" * 100 + "…" in detail and unknown not in detail, detail
