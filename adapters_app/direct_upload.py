"""Browser-direct uploads: presigned S3 multipart, so the bytes never pass through the web process.

Protocol (docs/console.md, "Uploads straight from the browser to S3"; Uppy ``@uppy/aws-s3`` drives steps 2-4 in the console):

1. ``upload_create``: the client declares each file's name, size and sha256. The server checks names, caps and the
   tenant's quotas up front (bytes of uploads still in flight count against the storage quota), picks every key
   under ``tenants/<pk>/uploads/<public id>/`` and starts one S3 multipart upload per file.
2. ``upload_sign_parts``: presigned ``UploadPart`` URLs (the create response carries each file's first 100 already), each for that upload's key and upload id only, short-lived,
   and with ``Content-Length`` signed, so a part cannot carry more bytes than the declared size leaves for it.
3. ``upload_complete_file``: the server lists the parts S3 holds, checks their numbers and sizes against the
   declaration (their sizes summed: completing with exactly those parts stores that size), and calls
   ``CompleteMultipartUpload`` itself.
4. When every file is complete a worker runs ``upload_verify``: it streams each object once to check its sha256
   (archives are unpacked there, as the through-Django path does in the request), then records the version and
   enqueues its validation. Until then no version exists, so bytes that do not match their declaration never
   become one.

Why a worker checks sha256: S3 cannot do it for us. A multipart ETag is an MD5 of part MD5s, and S3's additional
checksums are per part (``COMPOSITE``), full-object only for CRC algorithms, not SHA-256, and SeaweedFS does not keep
them. Reading the object back in the web process would cost it the CPU this path exists to save.

Nothing is orphaned: cancel aborts (``upload_abort``); ``uploads_sweep`` (beat) aborts uploads left open past
``QUIVER_UPLOAD_TTL_S``, re-sends verifications whose worker died, and aborts S3 multipart uploads under
``tenants/`` that no open upload owns.
"""

from __future__ import annotations

import logging
import re
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from adapters_app import storage
from adapters_app.models import Adapter, AdapterVersion, BaseModel, Upload
from adapters_app.purge import purge_s3_keys
from adapters_app.services import (
    ARCHIVE_SUFFIXES,
    SERVED_FILES,
    _check_version_quota,
    _rejected,
    adapter_version_record,
)
from adapters_app.validation import UploadRejected, check_upload_names, iter_archive
from common.echo import clip
from common.exceptions import QuiverError
from tenants.models import Tenant, slug_validator
from workers import schedule
from workers.enqueue import enqueue_on_commit, task_named

logger = logging.getLogger(__name__)

S3_MIN_PART = 5 * 1024 * 1024  # every part but the last (docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html)
S3_MAX_PARTS = 10_000
MAX_SIGN_BATCH = 100
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LIVE = (Upload.State.OPEN, Upload.State.VERIFYING)


def part_size_for(largest: int) -> int:
    """Part size in bytes for an upload whose largest file is ``largest`` bytes: ``QUIVER_UPLOAD_PART_BYTES`` (at
    least S3's 5 MiB), raised to stay within 10,000 parts."""
    size = max(settings.QUIVER_UPLOAD_PART_BYTES, S3_MIN_PART)
    return max(size, -(-largest // S3_MAX_PARTS))


def part_count(size: int, part_size: int) -> int:
    """Parts of a ``size``-byte file (at least one)."""
    return max(1, -(-size // part_size))


def _part_length(size: int, part_size: int, number: int) -> int:
    return min(part_size, size - (number - 1) * part_size)


def _bad(detail: str, code: str, field: str, status_code: int = 400) -> QuiverError:
    return QuiverError(detail, code=code, status_code=status_code, fields={field: [detail]})


def _check_declaration(files: Sequence[Mapping[str, Any]]) -> bool:
    """Shape, names and sizes of the declared files; returns whether it is one archive.

    Raises:
        QuiverError: ``no_files``, ``invalid`` (a size or sha256), intake codes (``upload_bad_filename``,
            ``pickle_weights``, ``missing_adapter_config``...), ``upload_unserved_file``, ``upload_too_large`` (413).
    """
    if not files:
        raise _bad("Declare the files to upload: [{name, size, sha256}], the two PEFT files or one archive.",
                   "no_files", "files")
    for entry in files:
        name = entry.get("name")
        if not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool) or entry["size"] <= 0:
            raise _bad(f"File {clip(name)!r}: size must be its length in bytes, above 0.", "invalid", "files")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            raise _bad(f"File {clip(name)!r}: sha256 must be 64 lowercase hex digits (sha256sum's output).",
                       "invalid", "files")
    names = [str(e.get("name") or "") for e in files]
    archive = len(files) == 1 and names[0].lower().endswith(ARCHIVE_SUFFIXES)
    try:
        if archive:
            check_upload_names([names[0], *SERVED_FILES])  # plain-name rules only; the archive's members come later
        else:
            check_upload_names(names)
    except UploadRejected as exc:
        raise _rejected(exc) from exc
    extra = [n for n in names if not archive and n not in SERVED_FILES]
    if extra:
        raise _bad(f"Only {' and '.join(SERVED_FILES)} are stored (the files the engine reads); leave out "
                   f"{clip(', '.join(extra))}.", "upload_unserved_file", "files")
    total = sum(e["size"] for e in files)
    if total > settings.QUIVER_MAX_UPLOAD_BYTES:
        raise _bad(f"Upload of {total} bytes exceeds QUIVER_MAX_UPLOAD_BYTES={settings.QUIVER_MAX_UPLOAD_BYTES}; "
                   "shrink the adapter or ask an operator to raise the limit.", "upload_too_large", "files", 413)
    return archive


def _check_target(tenant: Tenant, adapter_name: str, base_model_name: str | None) -> None:
    """The adapter exists (or can be created with ``base_model_name``) and may take one more version."""
    if len(adapter_name) > 40 or not re.match(slug_validator.regex, adapter_name):
        raise _bad(f"Invalid name '{clip(adapter_name)}': {slug_validator.message}", "invalid", "name")
    adapter = Adapter.objects.select_related("base_model").filter(tenant=tenant, name=adapter_name).first()
    if adapter is None:
        if not base_model_name:
            raise QuiverError(f"Adapter '{adapter_name}' does not exist; pass 'base_model' to create it with this "
                              "upload.", code="adapter_not_found", status_code=404)
        if not BaseModel.objects.filter(base_model_name=base_model_name).exists():
            known = list(BaseModel.objects.values_list("base_model_name", flat=True))
            raise _bad(f"Unknown base_model '{clip(base_model_name)}'. Registered base models: {known}.",
                       "base_model_not_found", "base_model")
        return
    if base_model_name and adapter.base_model.base_model_name != base_model_name:
        raise QuiverError(
            f"Adapter '{adapter_name}' is for base model '{adapter.base_model.base_model_name}', not "
            f"'{base_model_name}'; omit base_model or upload under a new adapter name.", code="base_model_mismatch",
            status_code=409, fields={"base_model": [f"Must be '{adapter.base_model.base_model_name}'."]})
    _check_version_quota(tenant, adapter)


def _check_storage(tenant: Tenant, adding: int) -> None:
    """Stored versions, plus uploads still in flight, plus ``adding`` must fit ``max_stored_bytes``."""
    stored = AdapterVersion.objects.filter(tenant=tenant).aggregate(total=Sum("size_bytes"))["total"] or 0
    in_flight = sum(f["size"] for files in Upload.objects.filter(tenant=tenant, state__in=LIVE)
                    .values_list("files", flat=True) for f in files)
    if stored + in_flight + adding > tenant.max_stored_bytes:
        raise QuiverError(
            f"Tenant storage quota of {tenant.max_stored_bytes} bytes would be exceeded ({stored} stored, {in_flight} "
            f"in uploads in progress, {adding} more); delete adapters, cancel uploads or ask an operator to raise "
            "max_stored_bytes.", code="quota_exceeded", status_code=403)


def upload_create(tenant: Tenant, *, adapter_name: str, base_model_name: str | None,
                  files: Sequence[Mapping[str, Any]]) -> Upload:
    """Open a browser-direct upload of a new version of ``adapter_name`` (see the module docstring, step 1).

    Args:
        files: ``[{"name", "size" (bytes), "sha256" (hex)}]``: ``adapter_config.json`` and
            ``adapter_model.safetensors``, or one ``.zip``/``.tar.gz`` archive of the folder.

    Raises:
        QuiverError: the declaration's errors (``_check_declaration``), ``adapter_not_found`` (404),
            ``base_model_not_found``, ``base_model_mismatch`` (409), ``quota_exceeded`` (403),
            ``storage_unavailable`` (503).
    """
    _check_declaration(files)
    _check_target(tenant, adapter_name, base_model_name)
    total = sum(int(f["size"]) for f in files)
    public_id = uuid.uuid4().hex
    prefix = f"tenants/{tenant.pk}/uploads/{public_id}/"
    declared: list[dict[str, Any]] = [{"name": str(f["name"]), "size": int(f["size"]), "sha256": str(f["sha256"]),
                 "key": prefix + str(f["name"]), "upload_id": "", "completed": False} for f in files]
    with transaction.atomic():
        # Under the tenant row lock, two uploads cannot both take the last of the quota.
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        _check_storage(locked, total)
        upload = Upload.objects.create(
            public_id=public_id, tenant=tenant, adapter_name=adapter_name, base_model_name=base_model_name or "",
            part_size=part_size_for(max(int(f["size"]) for f in files)), files=declared,
            expires_at=timezone.now() + timedelta(seconds=settings.QUIVER_UPLOAD_TTL_S))
    try:
        for entry in declared:
            entry["upload_id"] = storage.multipart_create(entry["key"])
    except (BotoCoreError, ClientError) as exc:
        logger.warning("upload.create_failed", extra={"upload": public_id, "error": str(exc)})
        _abort_in_s3(upload, declared)  # the sweeper retries what this cannot reach
        Upload.objects.filter(pk=upload.pk).update(state=Upload.State.ABORTED, files=declared)
        raise QuiverError("Artifact storage is unavailable; nothing was stored. Retry the upload shortly.",
                          code="storage_unavailable", status_code=503) from exc
    upload.files = declared
    upload.save(update_fields=["files"])
    logger.info("upload.created", extra={"upload": public_id, "tenant": tenant.slug, "bytes": total})
    return upload


def _file(upload: Upload, name: str) -> dict[str, Any]:
    entry = next((f for f in upload.files if f["name"] == name), None)
    if entry is None:
        declared = [f["name"] for f in upload.files]
        raise QuiverError(f"This upload has no file '{clip(name)}'; it declared {declared}.", code="upload_file_not_found",
                          status_code=404)
    return entry


def _require_open(upload: Upload) -> None:
    if upload.state != Upload.State.OPEN:
        raise QuiverError(f"Upload {upload.public_id} is {upload.state}; start a new upload.", code="upload_closed",
                          status_code=409)
    if upload.expires_at <= timezone.now():
        raise QuiverError(f"Upload {upload.public_id} expired; start a new upload.", code="upload_closed",
                          status_code=409)


def upload_sign_parts(upload: Upload, *, name: str, part_numbers: Sequence[int]) -> dict[int, str]:
    """Presigned ``UploadPart`` URLs for parts of one declared file (step 2), valid ``QUIVER_UPLOAD_URL_EXPIRY_S``.

    Each URL is for this upload's key and S3 upload id only, and signs the part's exact ``Content-Length``
    (``part_size``, the remainder for the last part).

    Raises:
        QuiverError: ``upload_closed`` (409), ``upload_file_not_found`` (404), ``invalid`` (a part number outside
            ``1..parts``, or more than 100 at once).
    """
    _require_open(upload)
    entry = _file(upload, name)
    count = part_count(entry["size"], upload.part_size)
    numbers = sorted(set(part_numbers))
    if not numbers or len(numbers) > MAX_SIGN_BATCH:
        raise _bad(f"Ask for 1 to {MAX_SIGN_BATCH} part numbers at a time.", "invalid", "part_numbers")
    bad = [n for n in numbers if not 1 <= n <= count]
    if bad:
        raise _bad(f"{name} is {entry['size']} bytes in {count} parts of {upload.part_size}; part numbers {bad} are "
                   f"outside 1..{count}.", "invalid", "part_numbers")
    return {n: storage.presign_part(entry["key"], entry["upload_id"], n, expires_s=settings.QUIVER_UPLOAD_URL_EXPIRY_S,
                                    content_length=_part_length(entry["size"], upload.part_size, n))
            for n in numbers}


def upload_first_urls(upload: Upload) -> dict[str, dict[int, str]]:
    """Presigned ``UploadPart`` URLs of each file's first parts (up to ``MAX_SIGN_BATCH`` per file), for the create
    response: a client uploads most files with no ``sign`` request at all (same URLs as ``upload_sign_parts``).

    Returns ``{file name: {part number: URL}}``. Raises ``QuiverError`` as ``upload_sign_parts``.
    """
    return {f["name"]: upload_sign_parts(upload, name=f["name"], part_numbers=range(
        1, min(part_count(f["size"], upload.part_size), MAX_SIGN_BATCH) + 1)) for f in upload.files}


def upload_list_parts(upload: Upload, *, name: str | None = None) -> list[dict[str, Any]]:
    """Parts S3 holds for one file (every file when ``name`` is None): ``[{"name", "PartNumber", "ETag", "Size"}]``,
    what a client resumes from after a dropped connection; a completed file lists none."""
    _require_open(upload)
    entries = [_file(upload, name)] if name is not None else upload.files
    return [{"name": e["name"], **part} for e in entries if not e["completed"]
            for part in storage.multipart_parts(e["key"], e["upload_id"])]


def upload_complete_file(upload: Upload, *, name: str, parts: Sequence[Mapping[str, Any]] | None = None) -> Upload:
    """Complete one file's multipart upload server-side (step 3); the last file starts verification.

    The parts come from S3's own listing; ``parts`` from the client (``[{"PartNumber", "ETag"}]``), when given, must
    name the same ones. Idempotent for a file already complete.

    Raises:
        QuiverError: ``upload_closed`` (409), ``upload_file_not_found`` (404), ``upload_incomplete`` (parts missing;
            upload them and complete again), ``upload_size_mismatch`` (the stored bytes differ from the declared
            size: the upload fails and its objects are deleted).
    """
    with transaction.atomic():
        upload = Upload.objects.select_for_update().get(pk=upload.pk)
        entry = _file(upload, name)
        if entry["completed"] and upload.state in (Upload.State.OPEN, Upload.State.VERIFYING, Upload.State.DONE):
            return upload
        _require_open(upload)
        stored = storage.multipart_parts(entry["key"], entry["upload_id"])
        count = part_count(entry["size"], upload.part_size)
        have = {p["PartNumber"]: p for p in stored}
        missing = [n for n in range(1, count + 1) if n not in have]
        if missing:
            raise QuiverError(f"{name}: parts {missing[:20]} of {count} are not uploaded yet; upload them, then "
                              "complete again.", code="upload_incomplete", fields={"parts": [f"missing {missing[:20]}"]})
        extra = sorted(n for n in have if n > count)
        if parts is not None:
            claimed = {(int(p.get("PartNumber", 0)), str(p.get("ETag", "")).strip('"')) for p in parts}
            actual = {(n, have[n]["ETag"].strip('"')) for n in range(1, count + 1)}
            if claimed != actual:
                raise QuiverError(f"{name}: the parts sent do not match the parts stored (numbers 1..{count} with "
                                  "the ETags S3 returned).", code="upload_parts_mismatch",
                                  fields={"parts": ["List parts 1..n with the ETag of each PUT."]})
        total = sum(have[n]["Size"] for n in range(1, count + 1))
        if extra or total != entry["size"]:
            _fail(upload, "upload_size_mismatch", f"{name}: the parts hold {total} bytes, {entry['size']} were "
                  "declared; the upload was discarded. Upload again declaring the file's true size.")
        else:
            # Completing with exactly the listed parts (by ETag) stores their summed size; no HEAD needed. A part
            # re-sent in between changes its ETag, and S3 refuses the completion (InvalidPart).
            storage.multipart_complete(entry["key"], entry["upload_id"], [have[n] for n in range(1, count + 1)])
            entry["completed"] = True
            fields = ["files"]
            if all(f["completed"] for f in upload.files):
                upload.state = Upload.State.VERIFYING
                fields.append("state")
                enqueue_on_commit(schedule.UPLOAD_VERIFY, upload.pk)
            upload.save(update_fields=fields)
            return upload
    error = upload.error or {}
    raise QuiverError(error.get("detail", "Upload failed."), code=error.get("code", "upload_failed"),
                      fields={"files": [error.get("detail", "")]})


def _abort_in_s3(upload: Upload, files: Sequence[Mapping[str, Any]]) -> None:
    """Abort the unfinished multipart uploads and schedule deletion of every key (durable ``Purge`` rows)."""
    for entry in files:
        if entry.get("upload_id") and not entry.get("completed"):
            try:
                storage.multipart_abort(entry["key"], entry["upload_id"])
            except (BotoCoreError, ClientError):
                logger.warning("upload.abort_failed", extra={"upload": upload.public_id, "key": entry["key"]})
    with transaction.atomic():
        purge_s3_keys([f["key"] for f in files], reason="upload_discarded")


def _fail(upload: Upload, code: str, detail: str) -> None:
    """Mark ``upload`` failed (inside the caller's transaction) and discard its objects."""
    upload.state = Upload.State.FAILED
    upload.error = {"code": code, "detail": detail}
    upload.save(update_fields=["state", "error"])
    _abort_in_s3(upload, upload.files)
    logger.warning("upload.failed", extra={"upload": upload.public_id, "code": code})


def upload_abort(upload: Upload, *, code: str = "upload_cancelled", detail: str = "Cancelled.") -> Upload:
    """Cancel an open upload: abort its S3 multipart uploads and delete what was stored. Idempotent.

    Raises:
        QuiverError: ``upload_closed`` (409) once verification has started (delete the version instead).
    """
    with transaction.atomic():
        upload = Upload.objects.select_for_update().get(pk=upload.pk)
        if upload.state in (Upload.State.ABORTED, Upload.State.FAILED):
            return upload
        if upload.state != Upload.State.OPEN:
            raise QuiverError(f"Upload {upload.public_id} is {upload.state}; it can no longer be cancelled.",
                              code="upload_closed", status_code=409)
        upload.state = Upload.State.ABORTED
        upload.error = {"code": code, "detail": detail}
        upload.save(update_fields=["state", "error"])
        _abort_in_s3(upload, upload.files)
    logger.info("upload.aborted", extra={"upload": upload.public_id, "code": code})
    return upload


def upload_verify(upload_id: int) -> Upload | None:
    """Worker step 4: check every object's sha256 (unpacking an archive), then record the version.

    Returns the upload (``done`` with its version, or ``failed`` with ``error``), or None when it is gone or not
    ``verifying``. Storage errors propagate so the task retries; every other outcome is final.
    """
    claimed = Upload.objects.filter(pk=upload_id, state=Upload.State.VERIFYING).update(
        verify_claimed_at=timezone.now())
    if not claimed:
        return None
    upload = Upload.objects.select_related("tenant").get(pk=upload_id)
    if len(upload.files) == 1 and upload.files[0]["name"].lower().endswith(ARCHIVE_SUFFIXES):
        return _verify_archive(upload, upload.files[0])
    stored = []
    for entry in upload.files:
        digest, size = storage.object_sha256(entry["key"])
        if digest != entry["sha256"] or size != entry["size"]:
            return _verify_failed(upload, "sha256_mismatch", f"{entry['name']}: the stored bytes have sha256 "
                                  f"{digest}, not the declared {entry['sha256']}; upload the file again.")
        stored.append(storage.StoredObject(key=entry["key"], size=size, sha256=digest))
    return _record(upload, prefix=upload.prefix, stored=stored)


def _verify_archive(upload: Upload, entry: Mapping[str, Any]) -> Upload:
    """Unpack the archive in the worker (the same intake checks as the through-Django path), then record it."""
    prefix = f"tenants/{upload.tenant_id}/uploads/{uuid.uuid4().hex}/"
    stored: list[storage.StoredObject] = []
    try:
        with tempfile.TemporaryDirectory(prefix="quiver-upload-") as tmp:
            path = Path(tmp) / "archive"
            if storage.download_to(entry["key"], path) != entry["sha256"]:
                return _verify_failed(upload, "sha256_mismatch", f"{entry['name']}: the stored bytes do not match "
                                      "the declared sha256; upload the archive again.")
            for member in iter_archive(path, max_members=settings.QUIVER_MAX_ARCHIVE_MEMBERS,
                                       max_total_bytes=settings.QUIVER_MAX_UPLOAD_BYTES):
                if member.name in SERVED_FILES:
                    with member.open() as stream:
                        stored.append(storage.put_stream(prefix + member.name, stream,
                                                         limit=settings.QUIVER_MAX_UPLOAD_BYTES))
    except UploadRejected as exc:
        storage.delete_keys(o.key for o in stored)
        first = exc.problems[0]
        return _verify_failed(upload, first.code, f"{first.message} {first.hint}")
    except BaseException:
        storage.delete_keys(o.key for o in stored)
        raise
    with transaction.atomic():
        purge_s3_keys([entry["key"]], reason="upload_archive_unpacked")
    return _record(upload, prefix=prefix, stored=stored)


def _record(upload: Upload, *, prefix: str, stored: Sequence[storage.StoredObject]) -> Upload:
    try:
        version, _ = adapter_version_record(upload.tenant, adapter_name=upload.adapter_name,
                                            base_model_name=upload.base_model_name or None, prefix=prefix,
                                            stored=stored)
    except QuiverError as exc:
        storage.delete_keys(o.key for o in stored)
        return _verify_failed(upload, exc.code, str(exc.detail))
    Upload.objects.filter(pk=upload.pk).update(state=Upload.State.DONE, version=version)
    upload.refresh_from_db()
    logger.info("upload.done", extra={"upload": upload.public_id, "version_id": version.pk})
    return upload


def _verify_failed(upload: Upload, code: str, detail: str) -> Upload:
    with transaction.atomic():
        locked = Upload.objects.select_for_update().get(pk=upload.pk)
        if locked.state == Upload.State.VERIFYING:
            _fail(locked, code, detail)
    upload.refresh_from_db()
    return upload


def uploads_sweep(*, now: Any = None) -> dict[str, int]:
    """Beat job: abort expired open uploads, re-send stuck verifications, abort S3 multipart uploads no open upload
    owns (older than ``QUIVER_GC_GRACE_S``). Returns counts ``{"expired", "resent", "orphans"}``."""
    upload_verify_task = task_named(schedule.UPLOAD_VERIFY)
    now = now or timezone.now()
    expired = 0
    for upload in Upload.objects.filter(state=Upload.State.OPEN, expires_at__lte=now):
        upload_abort(upload, code="upload_expired",
                     detail=f"Not completed within {settings.QUIVER_UPLOAD_TTL_S} s; start a new upload.")
        expired += 1
    stale = now - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 60)
    resend = list(Upload.objects.filter(Q(verify_claimed_at__lt=stale) | Q(verify_claimed_at=None,
                                                                            created_at__lt=stale),
                                        state=Upload.State.VERIFYING).values_list("pk", flat=True))
    for pk in resend:
        upload_verify_task.delay(pk)
    owned = {(f["key"], f["upload_id"]) for files in Upload.objects.filter(state=Upload.State.OPEN)
             .values_list("files", flat=True) for f in files}
    cutoff = now - timedelta(seconds=settings.QUIVER_GC_GRACE_S)
    orphans = [(key, uid) for key, uid, initiated in storage.multipart_uploads("tenants/")
               if initiated < cutoff and (key, uid) not in owned]
    for key, uid in orphans:
        storage.multipart_abort(key, uid)
    if expired or resend or orphans:
        logger.warning("uploads.swept", extra={"expired": expired, "resent": len(resend), "orphans": len(orphans)})
    return {"expired": expired, "resent": len(resend), "orphans": len(orphans)}

