"""The S3 -> disk adapter cache against a real S3 server (no engine)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from inference.node.cache import COMPLETE_MARKER, AdapterCache, CacheError, FileSpec
from tests.fixtures.s3 import S3Server


@pytest.fixture
def cache(s3_server: S3Server, tmp_path: Path) -> AdapterCache:
    return AdapterCache(tmp_path / "cache", s3_origin=s3_server.endpoint_url)


def _put(s3_server: S3Server, data: bytes, name: str = "adapter_config.json") -> FileSpec:
    key = f"adapters/cache-{uuid.uuid4().hex}/{name}"
    client = s3_server.client()
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=data)
    url = client.generate_presigned_url("get_object", ExpiresIn=300, Params={"Bucket": s3_server.bucket, "Key": key})
    return FileSpec(name=name, s3_key=key, sha256=hashlib.sha256(data).hexdigest(), size=len(data), url=url)


def test_stage_downloads_then_reuses(cache: AdapterCache, s3_server: S3Server) -> None:
    spec = _put(s3_server, b'{"r": 8}')

    first = cache.stage("acme--a", 7, [spec])
    second = cache.stage("acme--a", 7, [spec])

    assert first.path == cache.root / "acme--a" / "7"
    assert (first.path / "adapter_config.json").read_bytes() == b'{"r": 8}'
    assert (first.downloaded_bytes, second.downloaded_bytes) == (8, 0)
    assert [(e.lora_name, e.lora_int_id) for e in cache.staged()] == [("acme--a", 7)]


def test_corrupted_local_copy_is_replaced(cache: AdapterCache, s3_server: S3Server) -> None:
    spec = _put(s3_server, b"good bytes")
    staged = cache.stage("acme--b", 8, [spec])
    (staged.path / spec.name).write_bytes(b"evil bytes")

    again = cache.stage("acme--b", 8, [spec])

    assert again.downloaded_bytes == len(b"good bytes")
    assert (staged.path / spec.name).read_bytes() == b"good bytes"


def test_size_mismatch_leaves_no_file_and_no_marker(cache: AdapterCache, s3_server: S3Server) -> None:
    spec = _put(s3_server, b"12345")
    wrong = FileSpec(spec.name, spec.s3_key, spec.sha256, size=4, url=spec.url)

    with pytest.raises(CacheError) as info:
        cache.stage("acme--c", 9, [wrong])

    assert (info.value.code, info.value.status) == ("size_mismatch", 422)
    folder = cache.root / "acme--c" / "9"
    assert not folder.exists()  # nothing was there before: no file, no marker, no empty folder
    assert not (cache.root / "acme--c").exists()
    assert cache.staged() == []


def test_remove_deletes_one_version_or_all(cache: AdapterCache, s3_server: S3Server) -> None:
    spec = _put(s3_server, b"x")
    cache.stage("acme--d", 1, [spec])
    cache.stage("acme--d", 2, [spec])

    cache.remove("acme--d", 1)
    assert [e.lora_int_id for e in cache.staged()] == [2]
    cache.remove("acme--d")
    assert cache.staged() == []


def _staged(root: Path, name: str, version: int, size: int, used: float) -> None:
    import os

    folder = root / name / str(version)
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"x" * size)
    marker = folder / COMPLETE_MARKER
    marker.write_text("adapter_model.safetensors\n")
    os.utime(marker, (used, used))


def test_the_disk_cache_keeps_its_byte_budget_least_recently_used_first(tmp_path: Path) -> None:
    cache = AdapterCache(tmp_path / "c", max_bytes=2500)
    _staged(cache.root, "t--old--1", 1, 1000, used=100)
    _staged(cache.root, "t--served--2", 2, 1000, used=50)  # oldest, but the engine serves it
    _staged(cache.root, "t--mid--3", 3, 1000, used=200)
    _staged(cache.root, "t--new--4", 4, 1000, used=300)
    evicted = cache.evict_to_budget({("t--served--2", 2)})
    assert [(e.lora_name, e.lora_int_id) for e in evicted] == [("t--old--1", 1), ("t--mid--3", 3)]
    assert sorted(e.lora_name for e in cache.staged()) == ["t--new--4", "t--served--2"]
    assert not (cache.root / "t--old--1").exists()


def test_an_unbounded_cache_evicts_nothing(tmp_path: Path) -> None:
    cache = AdapterCache(tmp_path / "c")
    _staged(cache.root, "t--a--1", 1, 10, used=1)
    assert cache.evict_to_budget(set()) == [] and len(cache.staged()) == 1
