"""Stage adapter files from S3 onto the node's disk, verifying sha256 while streaming.

The node holds no S3 credential: the control plane sends one presigned GET per file with each load
(``adapters_app.storage.presign_get``), so a node reads exactly the objects it is asked to load and can list, write or
delete nothing (docs/security.md). The agent fetches only from the S3 origin it is configured with.

Layout: `<cache_dir>/<lora_name>/<lora_int_id>/<file name>`, plus a `.complete` marker written once every
file is verified. The `lora_int_id` level matters: vLLM's prefix cache keys LoRA blocks by
`(lora_name, lora_path)` (`_gen_lora_extra_hash_keys` in `vllm/v1/core/kv_cache_utils.py`), so a new
adapter version served under the same name must get a new path, or cached KV blocks computed with the
old weights would be reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
_CHUNK = 1024 * 1024
# Served names are `<tenant_slug>--<adapter_slug>` or opaque ids; nothing that can escape the cache dir.
LORA_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CacheError(Exception):
    """Staging failed.

    Attributes:
        code: machine-readable code: `sha256_mismatch`, `size_mismatch`, `s3_object_missing`, `s3_error`,
            `invalid_request`.
        status: the HTTP status the agent should answer with.
        detail: human-readable message.
    """

    def __init__(self, code: str, status: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class FileSpec:
    """One adapter file as the control plane describes it.

    Attributes:
        name: plain file name, e.g. `adapter_config.json` (no directories).
        s3_key: object key in the bucket (named in errors and logs).
        sha256: lowercase hex digest of the content.
        size: content length in bytes.
        url: a presigned GET of that object, valid for minutes (never logged: it is a bearer credential).
    """

    name: str
    s3_key: str
    sha256: str
    size: int
    url: str = field(default="", repr=False)


@dataclass(frozen=True)
class StagedAdapter:
    """Result of `AdapterCache.stage`.

    Attributes:
        path: folder holding the verified files (what vLLM's `lora_path` should be).
        downloaded_bytes: bytes fetched from S3 now (0 when everything was reused).
        download_ms: wall time spent staging, in milliseconds (hash checks included).
    """

    path: Path
    downloaded_bytes: int
    download_ms: float


@dataclass(frozen=True)
class StagedEntry:
    """An adapter found complete on disk: `lora_name`, `lora_int_id` and its folder."""

    lora_name: str
    lora_int_id: int
    path: Path


def validate_files(lora_name: str, files: Sequence[FileSpec]) -> None:
    """Check names and digests before touching the disk.

    Raises:
        CacheError: `invalid_request` (400) for an unsafe name, a malformed digest, a negative size,
            duplicate file names or an empty list.
    """
    if not LORA_NAME_RE.match(lora_name):
        raise CacheError("invalid_request", 400, f"unsafe lora_name {lora_name!r}")
    if not files:
        raise CacheError("invalid_request", 400, "files must not be empty")
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise CacheError("invalid_request", 400, "duplicate file names")
    for spec in files:
        if not FILE_NAME_RE.match(spec.name) or spec.name == COMPLETE_MARKER:
            raise CacheError("invalid_request", 400, f"unsafe file name {spec.name!r}")
        if not SHA256_RE.match(spec.sha256):
            raise CacheError("invalid_request", 400, f"sha256 of {spec.name!r} must be 64 lowercase hex")
        if spec.size < 0:
            raise CacheError("invalid_request", 400, f"size of {spec.name!r} must be >= 0")


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_origin_allowed(url: str, s3_origin: str | None) -> bool:
    """Whether ``url`` points at the node's S3 server: same scheme, host and port as ``s3_origin``
    (``AWS_S3_ENDPOINT_URL``), or an https ``*.amazonaws.com`` host when it is None (AWS itself). Keeps a stolen node
    key from turning the agent into a fetcher of arbitrary addresses."""
    if not url.isascii() or not url.isprintable() or " " in url:
        return False  # urlsplit drops tabs and newlines that httpx would refuse; nothing legitimate carries them
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number in [0, 65535] raises here
        if s3_origin is None:
            return parts.scheme == "https" and (parts.hostname or "").endswith(".amazonaws.com")
        origin = urlsplit(s3_origin)
        return (parts.scheme, parts.hostname, port) == (origin.scheme, origin.hostname, origin.port)
    except ValueError:
        return False


class AdapterCache:
    """The node's on-disk adapter cache, filled through presigned GETs of one S3 server.

    Blocking (httpx and file I/O): call from a worker thread in async code.

    Args:
        root: cache directory (created if missing).
        s3_origin: the S3 endpoint presigned URLs must point at (``AWS_S3_ENDPOINT_URL``); None is AWS itself.
        max_bytes: byte budget of the cache (``QUIVER_NODE_CACHE_MAX_BYTES``); None is unbounded. Enforced by
            :meth:`evict_to_budget`, least recently staged first.
    """

    def __init__(self, root: Path, *, s3_origin: str | None = None, max_bytes: int | None = None) -> None:
        self.root = root
        self.s3_origin = s3_origin
        self.max_bytes = max_bytes
        self._http = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0), follow_redirects=False)
        root.mkdir(parents=True, exist_ok=True)

    def adapter_dir(self, lora_name: str, lora_int_id: int) -> Path:
        """Folder of one adapter version: `<root>/<lora_name>/<lora_int_id>`."""
        return self.root / lora_name / str(lora_int_id)

    def stage(self, lora_name: str, lora_int_id: int, files: Sequence[FileSpec]) -> StagedAdapter:
        """Make every file present and verified in the adapter's folder.

        A file already there with the right size and sha256 is reused; anything else is downloaded to a
        temp file in the same folder, hashed while streaming, and renamed into place only if it matches.

        Args:
            lora_name: served name (safe path component, see `LORA_NAME_RE`).
            lora_int_id: engine id (the AdapterVersion pk), >= 1.
            files: the adapter's files.

        Returns:
            Where the files are, how many bytes were downloaded and how long it took.

        Raises:
            CacheError: `invalid_request` (400: also a file with no presigned `url`, or one outside the S3 origin),
                `s3_object_missing` (404), `s3_url_refused` (403: expired or not signed for that object), `s3_error` (502),
                `sha256_mismatch` / `size_mismatch` (422; the bad download is deleted, and a stale
                local copy that fails verification is deleted too).
        """
        validate_files(lora_name, files)
        for spec in files:
            if not spec.url:
                raise CacheError("invalid_request", 400, f"file {spec.name!r} has no presigned url")
            if not fetch_origin_allowed(spec.url, self.s3_origin):
                raise CacheError("invalid_request", 400,
                                 f"url of {spec.name!r} is not on this node's S3 endpoint (AWS_S3_ENDPOINT_URL)")
        if lora_int_id < 1:
            raise CacheError("invalid_request", 400, "lora_int_id must be >= 1")
        started = time.perf_counter()
        folder = self.adapter_dir(lora_name, lora_int_id)
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / COMPLETE_MARKER
        downloaded = 0
        try:
            for spec in files:
                target = folder / spec.name
                if target.exists():
                    if target.stat().st_size == spec.size and sha256_of(target) == spec.sha256:
                        continue
                    logger.warning("cache.stale_file_removed", extra={"lora_name": lora_name, "file": spec.name})
                    marker.unlink(missing_ok=True)
                    target.unlink()
                downloaded += self._download(spec, target)
        except CacheError:
            with contextlib.suppress(OSError):  # a failed first load leaves no empty folders behind
                folder.rmdir()
                folder.parent.rmdir()
            raise
        marker.write_text("\n".join(sorted(f.name for f in files)) + "\n")
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        logger.info(
            "cache.staged",
            extra={
                "lora_name": lora_name,
                "lora_int_id": lora_int_id,
                "downloaded_bytes": downloaded,
                "download_ms": round(elapsed_ms, 1),
            },
        )
        return StagedAdapter(path=folder, downloaded_bytes=downloaded, download_ms=elapsed_ms)

    def _download(self, spec: FileSpec, target: Path) -> int:
        tmp = target.with_name(f".{spec.name}.tmp-{uuid.uuid4().hex}")
        digest = hashlib.sha256()
        size = 0
        try:
            try:
                with self._http.stream("GET", spec.url) as response:
                    if response.status_code == 404:
                        raise CacheError("s3_object_missing", 404, f"s3 object {spec.s3_key!r} is missing")
                    if response.status_code == 403:
                        raise CacheError("s3_url_refused", 403,
                                         f"s3 refused the presigned GET of {spec.s3_key!r} (expired or wrongly signed)")
                    if response.status_code != 200:
                        raise CacheError("s3_error", 502, f"s3 get {spec.s3_key!r} failed: HTTP {response.status_code}")
                    with tmp.open("wb") as handle:
                        for chunk in response.iter_bytes(_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            if size > spec.size:
                                break
                            handle.write(chunk)
                        handle.flush()
                        os.fsync(handle.fileno())
            except httpx.InvalidURL as exc:
                raise CacheError("invalid_request", 400, f"url of {spec.name!r} is not a valid URL") from exc
            except httpx.HTTPError as exc:
                raise CacheError("s3_error", 502, f"s3 get {spec.s3_key!r} failed: {type(exc).__name__}") from exc
            if size != spec.size:
                raise CacheError("size_mismatch", 422, f"{spec.name}: expected {spec.size} bytes, got {size}")
            if digest.hexdigest() != spec.sha256:
                raise CacheError(
                    "sha256_mismatch",
                    422,
                    f"{spec.name}: expected sha256 {spec.sha256}, got {digest.hexdigest()}",
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return size

    def staged(self) -> list[StagedEntry]:
        """List complete adapter versions on disk (folders with the `.complete` marker), sorted."""
        entries: list[StagedEntry] = []
        if not self.root.exists():
            return entries
        for marker in sorted(self.root.glob("*/*/" + COMPLETE_MARKER)):
            version_dir = marker.parent
            if not version_dir.name.isdigit():
                continue
            entries.append(StagedEntry(version_dir.parent.name, int(version_dir.name), version_dir))
        return entries

    def remove(self, lora_name: str, lora_int_id: int | None = None) -> None:
        """Delete an adapter's staged files (one version, or every version when `lora_int_id` is None)."""
        target = self.root / lora_name if lora_int_id is None else self.adapter_dir(lora_name, lora_int_id)
        if LORA_NAME_RE.match(lora_name) and target.exists():
            shutil.rmtree(target)

    def usage(self) -> list[tuple[StagedEntry, int, float]]:
        """``(entry, bytes, last_used)`` for every complete version on disk; ``last_used`` is the marker's mtime
        (rewritten by every :meth:`stage`, so it orders versions by their last load)."""
        out = []
        for entry in self.staged():
            size = sum(f.stat().st_size for f in entry.path.iterdir() if f.is_file())
            out.append((entry, size, (entry.path / COMPLETE_MARKER).stat().st_mtime))
        return out

    def over_budget(self, keep: set[tuple[str, int]]) -> list[StagedEntry]:
        """The least recently used versions to delete for the cache to fit ``max_bytes`` (LRU); deletes nothing.

        Args:
            keep: ``(lora_name, lora_int_id)`` never chosen, even when they alone exceed the budget.

        Returns:
            The versions to delete, oldest first (empty when the cache fits or has no budget).
        """
        if self.max_bytes is None:
            return []
        entries = sorted(self.usage(), key=lambda item: item[2])
        total = sum(size for _, size, _ in entries)
        chosen: list[StagedEntry] = []
        for entry, size, _ in entries:
            if total <= self.max_bytes:
                break
            if (entry.lora_name, entry.lora_int_id) in keep:
                continue
            total -= size
            chosen.append(entry)
        return chosen

    def delete(self, entries: list[StagedEntry]) -> None:
        """Delete these versions' folders (and a name's folder once its last version is gone)."""
        for entry in entries:
            shutil.rmtree(entry.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                entry.path.parent.rmdir()
        if entries:
            logger.info("cache.evicted", extra={"versions": len(entries), "max_bytes": self.max_bytes})

    def evict_to_budget(self, keep: set[tuple[str, int]]) -> list[StagedEntry]:
        """Delete least recently used versions until the cache fits ``max_bytes`` (LRU): :meth:`over_budget`, then
        :meth:`delete`.

        Args:
            keep: ``(lora_name, lora_int_id)`` the engine reloads from these paths: never deleted, even when they
                alone exceed the budget.

        Returns:
            The versions deleted, oldest first.
        """
        evicted = self.over_budget(keep)
        self.delete(evicted)
        return evicted
