"""Nodes hold no S3 credential (issue 30 point 4), tried against the real S3 server of the test session.

Each load carries one presigned GET per file, signed by the control plane (``adapters_app.storage.presign_get``, what
``inference.fleet.warming.placement_warm`` sends). So the node can read what it was asked to load and nothing else:
with what it holds it cannot list, write, delete, read another object, or read after the URL expires. The demo and the
tests' agents give node processes no S3 key at all.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.conf import settings

from adapters_app import storage
from demo.run import node_process_env
from inference.node.cache import AdapterCache, CacheError, FileSpec
from tests.fixtures.s3 import S3Server

BODY = b"\x00weights\x01" * 100


@pytest.fixture
def objects(s3_server: S3Server) -> Iterator[tuple[str, str]]:
    """Two tenants' adapter objects, written with the control plane's key: ``(asked, other)``."""
    run = uuid.uuid4().hex[:8]
    asked, other = f"tenants/7/uploads/{run}/adapter_model.safetensors", f"tenants/8/uploads/{run}/adapter_config.json"
    admin = s3_server.client()
    for key in (asked, other):
        admin.put_object(Bucket=s3_server.bucket, Key=key, Body=BODY)
    yield asked, other
    admin.delete_objects(Bucket=s3_server.bucket, Delete={"Objects": [{"Key": asked}, {"Key": other}]})


def _with_path(url: str, path: str, query: str | None = None) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query if query is None else query, ""))


def test_node_processes_get_no_s3_credential() -> None:
    from tests.fixtures.stack import node_s3_env

    control = {"AWS_ACCESS_KEY_ID": "quiver", "AWS_SECRET_ACCESS_KEY": "s", "AWS_S3_ENDPOINT_URL": "http://s3:1",
               "DJANGO_SECRET_KEY": "x", "DATABASE_URL": "postgres://", "PATH": "/bin"}
    demo_node = node_process_env(control)
    assert demo_node == {"AWS_S3_ENDPOINT_URL": "http://s3:1", "PATH": "/bin"}
    assert node_s3_env() == {"AWS_S3_ENDPOINT_URL": settings.AWS_S3_ENDPOINT_URL}


@pytest.mark.django_db
def test_the_node_stages_what_it_was_asked_to_load(objects: tuple[str, str], s3_server: S3Server,
                                                    tmp_path: Path) -> None:
    asked, _ = objects
    url = storage.presign_get(asked, expires_s=60)
    cache = AdapterCache(tmp_path / "cache", s3_origin=settings.AWS_S3_ENDPOINT_URL)
    spec = FileSpec("adapter_model.safetensors", asked, hashlib.sha256(BODY).hexdigest(), len(BODY), url)
    staged = cache.stage("acme--bot", 3, [spec])
    assert (staged.path / "adapter_model.safetensors").read_bytes() == BODY
    assert url not in repr(spec)  # never in a log line


@pytest.mark.django_db
def test_the_url_reads_one_object_and_does_nothing_else(objects: tuple[str, str], s3_server: S3Server) -> None:
    asked, other = objects
    url = storage.presign_get(asked, expires_s=60)
    bucket = s3_server.bucket
    with httpx.Client(timeout=10) as http:
        assert http.get(url).content == BODY
        # Another tenant's object, the bucket listing, or the bucket root with the same signature.
        assert http.get(_with_path(url, f"/{bucket}/{other}")).status_code == 403
        assert http.get(_with_path(url, f"/{bucket}/", "list-type=2&prefix=tenants/&" + urlsplit(url).query)
                        ).status_code == 403
        assert http.get(_with_path(url, f"/{bucket}/")).status_code == 403
        # Write, overwrite, delete, start a multipart upload.
        assert http.put(url, content=b"poisoned").status_code == 403
        assert http.put(_with_path(url, f"/{bucket}/tenants/9/new"), content=b"x").status_code == 403
        assert http.delete(url).status_code == 403
        assert http.post(_with_path(url, f"/{bucket}/{asked}", "uploads&" + urlsplit(url).query)).status_code == 403
        # Without the signature the server answers as to anyone: nothing.
        assert http.get(_with_path(url, f"/{bucket}/{asked}", "")).status_code == 403
    admin = s3_server.client()
    assert admin.get_object(Bucket=bucket, Key=asked)["Body"].read() == BODY
    assert admin.list_objects_v2(Bucket=bucket, Prefix="tenants/9/").get("KeyCount", 0) == 0


@pytest.mark.django_db
def test_an_expired_url_is_refused_and_the_node_says_so(objects: tuple[str, str], tmp_path: Path) -> None:
    asked, _ = objects
    url = storage.presign_get(asked, expires_s=3)  # S3 dates a signature to the second: valid 2 to 3 s from now
    signed_at = time.monotonic()
    with httpx.Client(timeout=10) as http:
        assert http.get(url).status_code == 200
        deadline = signed_at + 30
        while http.get(url).status_code == 200:  # S3 checks expiry to the second; poll, bounded
            assert time.monotonic() < deadline, "a 3 s presigned GET still read after 30 s"
            time.sleep(0.2)
    cache = AdapterCache(tmp_path / "cache", s3_origin=settings.AWS_S3_ENDPOINT_URL)
    with pytest.raises(CacheError) as caught:
        cache.stage("acme--late", 4, [FileSpec("adapter_model.safetensors", asked,
                                               hashlib.sha256(BODY).hexdigest(), len(BODY), url)])
    assert (caught.value.code, caught.value.status) == ("s3_url_refused", 403)
    assert not (tmp_path / "cache" / "acme--late").exists()  # no partial file, no empty folder left


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "http://127.0.0.1:1/quiver/k", "",
    # Malformed forms that crashed the agent with a 500 (attack round): ports urlsplit cannot read, and control
    # characters urlsplit silently drops but httpx refuses.
    "http://127.0.0.1:+8333/quiver/k", "http://127.0.0.1:73869/quiver/k", "http://127.0.0.1:\u0668\u0663\u0663\u0663/k",
    "http://127.0.0.1:8333\t/quiver/k", "http://127.0.0.1:8333/quiver/k\x00", "http://127.0.0.1:8333/quiver/k v"])
def test_the_agent_fetches_only_from_its_s3_endpoint(url: str, tmp_path: Path) -> None:
    """A stolen node key must not make the agent fetch arbitrary addresses for its caller, nor crash it."""
    cache = AdapterCache(tmp_path / "cache", s3_origin="http://127.0.0.1:8333")
    with pytest.raises(CacheError) as caught:
        cache.stage("acme--x", 1, [FileSpec("a.bin", "tenants/1/a.bin", "a" * 64, 1, url)])
    assert (caught.value.code, caught.value.status) == ("invalid_request", 400)
    assert not (tmp_path / "cache" / "acme--x").exists()


def test_on_aws_only_https_amazonaws_hosts_are_fetched(tmp_path: Path) -> None:
    from inference.node.cache import fetch_origin_allowed

    assert fetch_origin_allowed("https://s3.eu-west-1.amazonaws.com/quiver/tenants/1/a?X-Amz-Signature=x", None)
    assert not fetch_origin_allowed("http://s3.eu-west-1.amazonaws.com/quiver/tenants/1/a", None)
    assert not fetch_origin_allowed("https://amazonaws.com.evil.example/quiver/a", None)
