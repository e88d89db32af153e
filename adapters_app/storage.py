"""Adapter artifacts in S3 via boto3: streamed uploads with a running sha256, deletes, downloads.

The endpoint comes from ``AWS_S3_ENDPOINT_URL`` (SeaweedFS locally, MinIO in compose, AWS in production). Path-style
addressing and SigV4 for every one of them (docs/services.md, "S3 client settings").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.config import Config
from django.conf import settings

CHUNK = 1024 * 1024


@lru_cache(maxsize=1)
def s3_client() -> Any:
    """A boto3 S3 client built from settings (cached per process)."""
    return boto3.client(
        "s3",
        endpoint_url=settings.AWS_S3_ENDPOINT_URL,
        aws_access_key_id=settings.AWS_ACCESS_KEY_ID,
        aws_secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        region_name=settings.AWS_S3_REGION_NAME,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
    )


@lru_cache(maxsize=4)
def _presigner(endpoint_url: str | None) -> Any:
    """A boto3 client that only presigns, for ``endpoint_url`` (cached per endpoint): a SigV4 signature covers the
    host, so it must be the one the URL's user sends to."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=settings.AWS_ACCESS_KEY_ID,
        aws_secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        region_name=settings.AWS_S3_REGION_NAME,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def s3_browser_client() -> Any:
    """The presigning client for the endpoint browsers reach (``AWS_S3_BROWSER_ENDPOINT_URL``, default
    ``AWS_S3_ENDPOINT_URL``)."""
    return _presigner(settings.AWS_S3_BROWSER_ENDPOINT_URL or settings.AWS_S3_ENDPOINT_URL)


def presign_get(key: str, *, expires_s: int) -> str:
    """A URL that GETs object ``key`` (that one object, no other method) for ``expires_s`` seconds.

    What a node is given with each load instead of a standing S3 credential (docs/security.md): the signature covers
    the method, bucket and key, so the URL reads nothing else and writes, lists or deletes nothing. Signed for
    ``AWS_S3_NODE_ENDPOINT_URL`` (default ``AWS_S3_ENDPOINT_URL``), the host nodes send to. Signing is local (no
    request to S3); botocore raises ``NoCredentialsError`` when no key is configured.
    """
    return _presigner(settings.AWS_S3_NODE_ENDPOINT_URL or settings.AWS_S3_ENDPOINT_URL).generate_presigned_url(
        "get_object", ExpiresIn=expires_s, Params={"Bucket": settings.AWS_STORAGE_BUCKET_NAME, "Key": key})


class SizeLimitExceeded(Exception):
    """More bytes arrived than the cap allows; ``limit`` is that cap in bytes."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


class _HashingReader:
    """Wraps a readable stream: hashes and counts bytes as boto3 pulls them, failing past ``limit`` bytes.

    Deliberately not seekable, so s3transfer reads it front to back in chunks instead of loading it whole.
    """

    def __init__(self, raw: IO[bytes], limit: int):
        self._raw = raw
        self._limit = limit
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(CHUNK if n is None or n < 0 else n)
        self.size += len(data)
        if self.size > self._limit:
            raise SizeLimitExceeded(self._limit)
        self.sha256.update(data)
        return data


@dataclass(frozen=True)
class StoredObject:
    """An object written by :func:`put_stream`: its key, size in bytes and hex sha256."""

    key: str
    size: int
    sha256: str


def put_stream(key: str, stream: IO[bytes], *, limit: int) -> StoredObject:
    """Stream ``stream`` to ``key`` in the artifact bucket, hashing on the way (multipart for large bodies).

    Raises:
        SizeLimitExceeded: more than ``limit`` bytes were read (the partial object is not completed).
        botocore.exceptions.ClientError: the S3 server refused the write.
    """
    reader = _HashingReader(stream, limit)
    s3_client().upload_fileobj(reader, settings.AWS_STORAGE_BUCKET_NAME, key)
    return StoredObject(key=key, size=reader.size, sha256=reader.sha256.hexdigest())


def delete_keys(keys: Iterable[str]) -> None:
    """Delete objects (missing ones are fine), in batches of 1,000 as S3's DeleteObjects allows."""
    keys = list(keys)
    for start in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[start : start + 1000]]
        s3_client().delete_objects(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Delete={"Objects": batch, "Quiet": True})


def list_keys(prefix: str) -> list[str]:
    """Every key under ``prefix``."""
    paginator = s3_client().get_paginator("list_objects_v2")
    keys: list[str] = []
    for page in paginator.paginate(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return keys


def list_objects(prefix: str) -> list[tuple[str, datetime]]:
    """``(key, last_modified)`` of every object under ``prefix`` (timezone-aware UTC times)."""
    paginator = s3_client().get_paginator("list_objects_v2")
    found: list[tuple[str, datetime]] = []
    for page in paginator.paginate(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Prefix=prefix):
        found.extend((obj["Key"], obj["LastModified"]) for obj in page.get("Contents", []))
    return found


def download_to(key: str, path: Path) -> str:
    """Stream object ``key`` into ``path``; returns the hex sha256 of what was written."""
    body = s3_client().get_object(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key)["Body"]
    digest = hashlib.sha256()
    with closing(body), path.open("wb") as out:
        for chunk in body.iter_chunks(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


# --- Multipart uploads driven by a browser: the server creates, signs, lists, completes and aborts; the bytes of
# each part go from the browser straight to S3.

def warm_up() -> None:
    """Build both clients and load what browser-direct uploads call (operation, shape and paginator models,
    endpoint rules, signers) with no network call. Left to the first upload after a start it cost that upload
    about 30 ms of web CPU (ListParts' paginator alone 15 ms; measured beside ``scripts/bench_upload``). Signing is
    warmed only with keys in settings: other credentials may need a network call to resolve."""
    client = s3_client()
    browser = s3_browser_client()
    client.get_paginator("list_parts")
    for operation in ("CreateMultipartUpload", "ListParts", "CompleteMultipartUpload", "AbortMultipartUpload"):
        output = client.meta.service_model.operation_model(operation).output_shape
        if output is not None:
            output.members  # noqa: B018 (resolved lazily, then cached)
    if not (settings.AWS_ACCESS_KEY_ID and settings.AWS_SECRET_ACCESS_KEY):
        return
    for method, params in (("create_multipart_upload", {}), ("list_parts", {"UploadId": "warm-up"}),
                           ("abort_multipart_upload", {"UploadId": "warm-up"})):
        client.generate_presigned_url(method, ExpiresIn=60, Params={"Bucket": settings.AWS_STORAGE_BUCKET_NAME,
                                                                    "Key": "warm-up", **params})
    browser.generate_presigned_url("upload_part", ExpiresIn=60, Params={
        "Bucket": settings.AWS_STORAGE_BUCKET_NAME, "Key": "warm-up", "UploadId": "warm-up", "PartNumber": 1,
        "ContentLength": 1})


def multipart_create(key: str) -> str:
    """Start a multipart upload of ``key``; returns its ``UploadId``."""
    return s3_client().create_multipart_upload(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key)["UploadId"]


def presign_part(key: str, upload_id: str, part_number: int, *, content_length: int, expires_s: int) -> str:
    """A URL that PUTs exactly ``content_length`` bytes as part ``part_number`` of ``upload_id`` (of ``key`` only).

    ``Content-Length`` is among the signed headers, so S3 answers ``SignatureDoesNotMatch`` to a body of any other
    length (checked against SeaweedFS 4.48 and AWS); the browser sets that header itself from the part's slice.
    """
    return s3_browser_client().generate_presigned_url(
        "upload_part", ExpiresIn=expires_s,
        Params={"Bucket": settings.AWS_STORAGE_BUCKET_NAME, "Key": key, "UploadId": upload_id,
                "PartNumber": part_number, "ContentLength": content_length})


def multipart_parts(key: str, upload_id: str) -> list[dict[str, Any]]:
    """Parts stored so far: ``[{"PartNumber", "ETag", "Size"}]`` ascending (paginated past 1,000)."""
    paginator = s3_client().get_paginator("list_parts")
    parts: list[dict[str, Any]] = []
    for page in paginator.paginate(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key, UploadId=upload_id):
        parts.extend({"PartNumber": p["PartNumber"], "ETag": p["ETag"], "Size": p["Size"]}
                     for p in page.get("Parts", []))
    return sorted(parts, key=lambda p: p["PartNumber"])


def multipart_complete(key: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
    """Complete ``upload_id`` from ``[{"PartNumber", "ETag"}]`` (ascending)."""
    s3_client().complete_multipart_upload(
        Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key, UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]})


def multipart_abort(key: str, upload_id: str) -> None:
    """Abort ``upload_id`` and free its parts; an upload already gone (aborted, completed) is fine."""
    try:
        s3_client().abort_multipart_upload(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key, UploadId=upload_id)
    except s3_client().exceptions.NoSuchUpload:
        pass
    except Exception as exc:  # SeaweedFS and MinIO answer 404 with other codes for a finished upload
        if getattr(exc, "response", {}).get("Error", {}).get("Code") not in ("NoSuchUpload", "404", "NoSuchKey"):
            raise


def multipart_uploads(prefix: str) -> list[tuple[str, str, datetime]]:
    """``(key, upload_id, initiated)`` of every unfinished multipart upload under ``prefix``."""
    paginator = s3_client().get_paginator("list_multipart_uploads")
    found: list[tuple[str, str, datetime]] = []
    for page in paginator.paginate(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Prefix=prefix):
        found.extend((u["Key"], u["UploadId"], u["Initiated"]) for u in page.get("Uploads", []))
    return found


def object_sha256(key: str) -> tuple[str, int]:
    """Stream ``key`` once: ``(hex sha256, size in bytes)``; nothing is written to disk."""
    body = s3_client().get_object(Bucket=settings.AWS_STORAGE_BUCKET_NAME, Key=key)["Body"]
    digest = hashlib.sha256()
    size = 0
    with closing(body):
        for chunk in body.iter_chunks(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
