"""``quiver push``: validate locally, upload straight to S3 in parallel parts, resume, wait for validation.

The server side is the direct-upload protocol of ``adapters_app/direct_upload.py`` (the console's Uppy client speaks
it too): ``POST …/uploads`` declares each file's name, size and sha256 and answers with the upload's id, part size
and the first presigned part URLs; the client ``PUT``s each part to S3 (the bytes never pass through the web
process), the server completes each file from S3's own part listing, and a worker checks every sha256 before the
version exists and is validated.

Identical files: when a version of the adapter (not a rejected one) already holds exactly these files (names,
sizes and sha256), nothing is uploaded and the push answers with that version (``PushResult.existing``): the server
would keep only one version per content anyway (``AdapterVersion``'s unique ``(adapter, sha256)``), after all the
bytes had moved.

Resume: the upload's id is kept in a small state file (:func:`quiver_client.config.state_dir`), keyed by the
server, the key's id, the adapter and the files' digests. Rerunning the same push asks the server which parts S3
already holds (``GET …/parts``) and sends only the others; an upload already verifying goes straight to waiting.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from quiver_client import local_check
from quiver_client.api import Client
from quiver_client.config import state_dir
from quiver_client.errors import (
    EXIT_TIMEOUT,
    EXIT_UPLOAD_FAILED,
    ApiError,
    QuiverError,
    ValidationFailed,
)
from quiver_client.names import check_adapter_name
from quiver_client.progress import Reporter, Silent

CHUNK = 1024 * 1024
PUT_ATTEMPTS = 4
SIGN_BATCH = 100


@dataclass(frozen=True)
class LocalFile:
    """One file to send: its name on the server, local path, size in bytes and hex sha256."""

    name: str
    path: Path
    size: int
    sha256: str


@dataclass
class PushResult:
    """What a push did.

    Attributes:
        adapter: The adapter's name.
        upload_id: The direct upload's id.
        status: The version's status once known (``ready``, ``rejected``, ``uploaded``, ``validating``), or the
            upload's state when there is no version yet (``verifying`` with ``wait=False``).
        version: The version number (None before the worker recorded it).
        sha256: The version's sha256 (of the sorted ``(name, sha256)`` list), once known.
        parts_total: Parts of every file.
        parts_sent: Parts this run sent.
        parts_skipped: Parts S3 already held (a resumed push).
        bytes_sent: Bytes this run sent.
        resumed: Whether this run continued an earlier upload.
        existing: Whether a version already held exactly these files, so nothing was uploaded (``version``,
            ``status``, ``sha256`` and ``version_body`` are that version's; ``upload_id`` is empty).
        files: The files sent, ``[{name, size, sha256}]`` (local digests; the version's must equal them).
        local_report: The local validation's report (None with ``local_check=False``).
        version_body: The version's JSON as the API returns it (with ``validation_report``), once known.
    """

    adapter: str
    upload_id: str = ""
    status: str = ""
    version: int | None = None
    sha256: str | None = None
    parts_total: int = 0
    parts_sent: int = 0
    parts_skipped: int = 0
    bytes_sent: int = 0
    resumed: bool = False
    existing: bool = False
    files: list[dict[str, Any]] = field(default_factory=list)
    local_report: dict[str, Any] | None = None
    version_body: dict[str, Any] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``quiver push --json`` prints)."""
        return asdict(self)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _State:
    """The resume record of one push (server, key id, adapter, files) → upload id."""

    def __init__(self, client: Client, name: str, files: Sequence[LocalFile], folder: Path | None) -> None:
        key_id = (client.settings.api_key or "").partition(".")[0]
        ident = json.dumps([client.url, key_id, name, [(f.name, f.size, f.sha256) for f in files]])
        self.path = (folder or state_dir()) / "uploads" / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"

    def load(self) -> str | None:
        try:
            return str(json.loads(self.path.read_text())["upload_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, upload_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"upload_id": upload_id, "saved_at": time.time()}))
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def _part_length(size: int, part_size: int, number: int) -> int:
    return min(part_size, size - (number - 1) * part_size)


class _Parts:
    """Sends the missing parts of one upload, ``parallel`` at a time, to their presigned URLs."""

    def __init__(self, client: Client, name: str, upload: dict[str, Any], files: Sequence[LocalFile],
                 reporter: Reporter, *, parallel: int, s3: httpx.Client) -> None:
        self.client, self.name, self.upload, self.reporter = client, name, upload, reporter
        self.files = {f.name: f for f in files}
        self.part_size = int(upload["part_size"])
        self.parallel = max(1, parallel)
        self.s3 = s3
        self.urls: dict[tuple[str, int], str] = {
            (fname, int(n)): u for fname, parts in (upload.get("part_urls") or {}).items() for n, u in parts.items()}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent_parts = 0
        self.sent_bytes = 0

    def _sign(self, fname: str, numbers: Sequence[int]) -> None:
        for start in range(0, len(numbers), SIGN_BATCH):
            batch = numbers[start:start + SIGN_BATCH]
            for n, url in self.client.upload_sign(self.name, self.upload["id"], file=fname, part_numbers=batch).items():
                self.urls[(fname, n)] = url

    def _body(self, f: LocalFile, number: int, length: int, sent: list[int]) -> Iterator[bytes]:
        with f.path.open("rb") as src:
            src.seek((number - 1) * self.part_size)
            left = length
            while left > 0:
                if self.stop.is_set():
                    raise QuiverError("Upload stopped.", code="stopped")
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    raise QuiverError(f"{f.path} got shorter while uploading; do not change the files during a push.",
                                      code="file_changed", exit_code=EXIT_UPLOAD_FAILED)
                left -= len(chunk)
                sent[0] += len(chunk)
                self.reporter.advance(len(chunk))
                yield chunk

    def _put(self, fname: str, number: int) -> None:
        f = self.files[fname]
        length = _part_length(f.size, self.part_size, number)
        for attempt in range(PUT_ATTEMPTS):
            sent = [0]
            try:
                resp = self.s3.put(self.urls[(fname, number)], content=self._body(f, number, length, sent),
                                   headers={"Content-Length": str(length)})
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            else:
                if resp.status_code == 200:
                    with self.lock:
                        self.sent_parts += 1
                        self.sent_bytes += length
                    self.reporter.part_done()
                    return
                problem = f"HTTP {resp.status_code}"
                if resp.status_code == 403:  # the presigned URL expired: sign it again
                    self._sign(fname, [number])
            self.reporter.advance(-sent[0])
            if self.stop.is_set():
                raise QuiverError("Upload stopped.", code="stopped")
            if attempt + 1 == PUT_ATTEMPTS:
                # Never the URL: its query string is a credential for this part.
                raise QuiverError(f"Part {number} of {fname} could not be stored in S3 ({problem}, {PUT_ATTEMPTS} "
                                  "tries); check the network to the object store and rerun the same command to "
                                  "resume.", code="part_upload_failed")
            time.sleep(min(0.5 * 2**attempt, 4))

    def run(self, missing: dict[str, list[int]]) -> None:
        for fname, numbers in missing.items():
            unsigned = [n for n in numbers if (fname, n) not in self.urls]
            if unsigned:
                self._sign(fname, unsigned)
        jobs = [(fname, n) for fname, numbers in missing.items() for n in numbers]
        pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="quiver-part")
        futures: list[Future[None]] = []
        try:
            futures = [pool.submit(self._put, fname, n) for fname, n in jobs]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in done:
                error = fut.exception()
                if error is not None:
                    raise error
        finally:
            self.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)


def _collect(path: Path, stack: ExitStack, *, checked: bool) -> tuple[Path | None, list[tuple[str, Path]]]:
    """The folder to validate and the ``(name, path)`` files to send: a folder's two PEFT files, or an archive's
    (unpacked with the server's safe reader; sent as-is when the local check is off)."""
    if not path.exists():
        raise QuiverError(f"{path} does not exist; pass the folder PEFT's save_pretrained wrote (or a .zip/.tar.gz "
                          "of it).", code="path_not_found")
    if path.is_file():
        if not path.name.lower().endswith(local_check.ARCHIVE_SUFFIXES):
            raise QuiverError(f"{path} is a file but not an archive; pass the adapter folder (adapter_config.json + "
                              "adapter_model.safetensors) or a .zip/.tar.gz of it.", code="not_an_adapter")
        if not checked:
            return None, [(path.name, path)]
        path = stack.enter_context(local_check.unpacked(path))
    if not checked:
        return path, [(n, path / n) for n in local_check.SERVED_FILES]
    return path, [(n, path / n) for n in local_check.check_names(path)]


def _base_for(client: Client, name: str, base_model: str | None) -> dict[str, Any]:
    """The target base model's entry of ``GET /api/v1/base-models`` (the adapter's own when ``base_model`` is None)."""
    if base_model is None:
        try:
            base_model = str(client.adapter(name)["base_model"])
        except ApiError as exc:
            if exc.status == 404:
                raise QuiverError(f"Adapter '{name}' does not exist yet; pass --base-model to create it with this "
                                  "push.", code="adapter_not_found") from exc
            raise
    models = client.base_models()
    entry = next((m for m in models if m.get("base_model_name") == base_model), None)
    if entry is None:
        known = [m.get("base_model_name") for m in models]
        raise QuiverError(f"Unknown base model '{base_model}'; registered base models: {known}. Pass one of them "
                          "with --base-model.", code="base_model_not_found")
    return entry


def push(client: Client, path: Path, *, name: str, base_model: str | None = None, parallel: int = 4,
         wait_validation: bool = True, timeout: float = 900.0, local_check_enabled: bool = True,
         reporter: Reporter | None = None, state_folder: Path | None = None,
         s3_transport: httpx.BaseTransport | None = None, poll: Callable[[float], None] = time.sleep) -> PushResult:
    """Push the adapter at ``path`` as a new version of ``name``.

    Args:
        client: The server and key.
        path: A PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``; other files are not sent) or a
            ``.zip``/``.tar.gz`` of it.
        name: The adapter's name (what applications send as ``model``).
        base_model: Registered base model; needed to create the adapter, checked against an existing one.
        parallel: Parts in flight at once.
        wait_validation: Wait for the worker's sha256 check and validation (else return once uploaded).
        timeout: Seconds to wait for validation.
        local_check_enabled: Run the server's validator locally first (``--no-local-check`` turns it off).
        reporter: Progress (default: none).
        state_folder: Where resume state lives (default :func:`quiver_client.config.state_dir`).
        s3_transport: httpx transport for the part PUTs (tests count them; default: the network).
        poll: How to pause between status polls.

    Returns:
        The result; ``status`` is ``ready`` or, with ``wait_validation=False``, where things stood.

    Raises:
        ValidationFailed: local validation found errors (nothing was sent), or the server rejected the version.
        QuiverError: ``invalid_name`` (exit 2: ``name`` breaks the server's naming rule; nothing was read),
            ``upload_failed`` (exit 4: the server refused the bytes), ``validation_timeout`` (exit 5), or
            any API/network error, each naming its fix.
    """
    check_adapter_name(name)  # before any file is read: hashing a large adapter took minutes before the refusal
    reporter = reporter or Silent()
    result = PushResult(adapter=name)
    with ExitStack() as stack:
        if local_check_enabled:
            reporter.stage(f"checking {path} locally with Quiver's validator")
        folder, pairs = _collect(path, stack, checked=local_check_enabled)
        if local_check_enabled and folder is not None:
            base = _base_for(client, name, base_model)
            result.local_report = local_check.check_adapter(folder, base=base)
        reporter.stage("hashing files")
        files = [LocalFile(n, p, p.stat().st_size, sha256_file(p)) for n, p in pairs]
        result.files = [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files]
        state = _State(client, name, files, state_folder)
        same = _same_files_version(client, name, result.files, base_model=base_model)
        if same is not None:
            state.clear()  # an earlier push of these files that ended as this version: nothing left to resume
            reporter.stage(f"{name}@{same['number']} already holds these files (same sha256); nothing to upload")
            result.existing, result.version = True, int(same["number"])
            return _await_version(client, name, result, reporter, timeout=timeout if wait_validation else 0,
                                  poll=poll)
        upload = _resume(client, name, state, result)
        if upload is None:
            upload = client.upload_create(name, files=[{"name": f.name, "size": f.size, "sha256": f.sha256}
                                                       for f in files], base_model=base_model)
            state.save(upload["id"])
        result.upload_id = upload["id"]
        if upload["state"] == "open":
            _send(client, name, upload, files, reporter, result, parallel=parallel, s3_transport=s3_transport)
        upload = _await_upload(client, name, result.upload_id, state, reporter, timeout=timeout, poll=poll,
                               wait_verify=wait_validation)
    result.status = upload["state"]
    result.version = upload.get("version")
    if result.version is None:
        return result
    return _await_version(client, name, result, reporter, timeout=timeout if wait_validation else 0, poll=poll)


def _same_files_version(client: Client, name: str, files: Sequence[dict[str, Any]], *,
                        base_model: str | None) -> dict[str, Any] | None:
    """The newest version of ``name`` holding exactly ``files`` (``[{name, size, sha256}]``), unless rejected.

    None when the adapter does not exist yet, when ``base_model`` names another base than the adapter's (the upload
    then goes on and the server refuses it with ``base_model_mismatch``), for an archive sent as-is (its files are
    only known once unpacked server-side), or when no version matches. A rejected version with these files is
    uploaded again on purpose: the server validates it anew (an operator may have raised a limit since).
    """
    if len(files) == 1 and str(files[0]["name"]).lower().endswith(local_check.ARCHIVE_SUFFIXES):
        return None
    try:
        adapter = client.adapter(name)
        if base_model is not None and adapter.get("base_model") != base_model:
            return None
        versions = client.versions(name)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    local = sorted((str(f["name"]), int(f["size"]), str(f["sha256"])) for f in files)
    for version in versions:  # newest first
        stored = sorted((str(f["name"]), int(f["size"]), str(f["sha256"])) for f in version.get("files") or [])
        if stored == local and version.get("status") != "rejected":
            return version
    return None


def _resume(client: Client, name: str, state: _State, result: PushResult) -> dict[str, Any] | None:
    """The earlier upload of these same files, when the server still has it open or verifying."""
    upload_id = state.load()
    if upload_id is None:
        return None
    try:
        upload = client.upload(name, upload_id)
    except ApiError as exc:
        if exc.status != 404:
            raise
        upload = {"state": "gone"}
    if upload["state"] in ("open", "verifying", "done"):
        result.resumed = True
        return upload
    state.clear()  # failed, aborted or expired: start again
    return None


def _send(client: Client, name: str, upload: dict[str, Any], files: Sequence[LocalFile], reporter: Reporter,
          result: PushResult, *, parallel: int, s3_transport: httpx.BaseTransport | None) -> None:
    part_size = int(upload["part_size"])
    declared = {f["name"]: f for f in upload["files"]}
    stored: dict[str, set[int]] = {fname: set() for fname in declared}
    if result.resumed:
        for part in client.upload_parts(name, upload["id"]):
            f = next(x for x in files if x.name == part["name"])
            if int(part.get("Size", -1)) == _part_length(f.size, part_size, int(part["PartNumber"])):
                stored[part["name"]].add(int(part["PartNumber"]))
    missing: dict[str, list[int]] = {}
    for f in files:
        if declared[f.name]["completed"]:
            stored[f.name] = set(range(1, int(declared[f.name]["parts"]) + 1))
        missing[f.name] = [n for n in range(1, int(declared[f.name]["parts"]) + 1) if n not in stored[f.name]]
    result.parts_total = sum(int(d["parts"]) for d in declared.values())
    result.parts_skipped = sum(len(s) for s in stored.values())
    done_bytes = sum(_part_length(f.size, part_size, n) for f in files for n in stored[f.name])
    reporter.begin(total_bytes=sum(f.size for f in files), done_bytes=done_bytes, parts_total=result.parts_total,
                   parts_done=result.parts_skipped)
    with httpx.Client(timeout=httpx.Timeout(120.0, connect=15.0), transport=s3_transport) as s3:
        sender = _Parts(client, name, upload, files, reporter, parallel=parallel, s3=s3)
        try:
            sender.run({k: v for k, v in missing.items() if v})
        finally:
            result.parts_sent, result.bytes_sent = sender.sent_parts, sender.sent_bytes
            reporter.end()
    for f in files:
        if not declared[f.name]["completed"]:
            client.upload_complete(name, upload["id"], file=f.name)


def _await_upload(client: Client, name: str, upload_id: str, state: _State, reporter: Reporter, *, timeout: float,
                  poll: Callable[[float], None], wait_verify: bool) -> dict[str, Any]:
    """Poll the upload until the worker has checked every sha256 (``done``) or refused the bytes (``failed``)."""
    if wait_verify:
        reporter.stage("uploaded; the server is checking the sha256 of every file")
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        upload = client.upload(name, upload_id)
        if upload["state"] == "done":
            state.clear()
            return upload
        if upload["state"] in ("failed", "aborted"):
            state.clear()
            error = upload.get("error") or {}
            raise QuiverError(f"The server refused the upload: {error.get('detail') or upload['state']} "
                              f"({error.get('code') or upload['state']}). Rerun the push to upload again.",
                              code=str(error.get("code") or "upload_failed"), exit_code=EXIT_UPLOAD_FAILED)
        if not wait_verify:
            return upload
        if time.monotonic() >= deadline:
            raise QuiverError(f"Upload {upload_id} is still being checked after {timeout:.0f} s; rerun the same "
                              "command to keep waiting (nothing is sent again).", code="validation_timeout",
                              exit_code=EXIT_TIMEOUT)
        poll(delay)
        delay = min(delay * 1.5, 2.0)


def _check_stored(result: PushResult, body: dict[str, Any]) -> None:
    """The version holds exactly the local files (an archive sent as-is is unpacked server-side: not compared)."""
    if len(result.files) == 1 and result.files[0]["name"].lower().endswith(local_check.ARCHIVE_SUFFIXES):
        return
    stored = sorted((f["name"], f["size"], f["sha256"]) for f in body.get("files") or [])
    local = sorted((f["name"], f["size"], f["sha256"]) for f in result.files)
    if stored != local:
        raise QuiverError(f"{result.adapter} v{result.version} does not hold the files pushed (sha256 differs); delete "
                          "that version and push again.", code="sha256_mismatch", exit_code=EXIT_UPLOAD_FAILED)


def _await_version(client: Client, name: str, result: PushResult, reporter: Reporter, *, timeout: float,
                   poll: Callable[[float], None]) -> PushResult:
    """Poll the version until validation ends; ``ready`` returns, ``rejected`` raises with the report."""
    assert result.version is not None
    if timeout:
        reporter.stage(f"version {result.version} recorded; waiting for validation")
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        body = client.version(name, result.version)
        result.version_body, result.status, result.sha256 = body, str(body["status"]), body.get("sha256")
        _check_stored(result, body)
        if body["status"] == "ready":
            return result
        if body["status"] == "rejected":
            report = body.get("validation_report") or {"ok": False, "problems": []}
            errors = [p for p in report.get("problems", []) if p.get("severity") == "error"] or [
                {"code": "rejected", "message": "The server rejected the version.", "hint": "See its report."}]
            first = errors[0]
            raise ValidationFailed(f"{name} v{result.version} was rejected by validation: {first['code']}: "
                                   f"{first['message']} Fix: {first['hint']}", report=report, where="server")
        if time.monotonic() >= deadline:
            if not timeout:
                return result
            raise QuiverError(f"{name} v{result.version} is still {body['status']} after {timeout:.0f} s; rerun "
                              f"`quiver versions show {name}@{result.version}` later.", code="validation_timeout",
                              exit_code=EXIT_TIMEOUT)
        poll(delay)
        delay = min(delay * 1.5, 2.0)


__all__ = ["LocalFile", "PushResult", "push", "sha256_file"]
