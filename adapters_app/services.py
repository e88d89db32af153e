"""Writes for the adapter registry: base model registration, adapter creation, version upload and validation."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from adapters_app import storage
from adapters_app.chat_template import compile_chat_template
from adapters_app.models import Adapter, AdapterVersion, BaseModel, BaseModelTokenizer, tokenizer_files_sha256
from adapters_app.purge import purge_s3_keys
from adapters_app.signals import adapter_deleting, base_model_registered
from adapters_app.validation import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    BaseModelFacts,
    PoolLimits,
    UploadRejected,
    check_upload_names,
    iter_archive,
    validate_adapter_dir,
)
from common.echo import clip
from common.exceptions import QuiverError
from tenants.models import Tenant
from workers import schedule
from workers.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def base_model_register(
    *,
    base_model_name: str,
    hf_config: Mapping[str, Any],
    node_pool: str = "default",
    max_lora_rank: int = 16,
    max_adapter_bytes: int = 512 * 1024 * 1024,
    tokenizer_json: str | None = None,
    chat_template: str = "",
    special_tokens: dict[str, str] | None = None,
) -> BaseModel:
    """Register (or update the limits of) a base model from its HF ``config.json``, and with ``tokenizer_json`` (the
    model's ``tokenizer.json`` text) store its tokenizer for the gateway's prompt counts (:class:`BaseModelTokenizer`;
    None keeps what is stored), with ``chat_template`` (the template vLLM renders chats with; ``""`` for none) and
    ``special_tokens`` (``adapters_app.chat_template.special_tokens_from_config``) so chats are counted too.

    Raises:
        ValueError: the architecture is not one the validator can describe (message names the config field), the
            name is already a tenant adapter's name, or ``tokenizer.json`` is not one the ``tokenizers`` library
            loads or is over ``TOKENIZER_MAX_BYTES``, or the chat template does not compile.
    """
    if Adapter.objects.filter(name=base_model_name).exists():
        raise ValueError(f"base_model_name {base_model_name!r} is already an adapter's name; the gateway would route "
                         "that tenant's traffic to the base model. Choose another served name.")
    facts = BaseModelFacts.from_hf_config(base_model_name, hf_config)
    if tokenizer_json is not None:
        _check_tokenizer_json(tokenizer_json)
    if chat_template:
        try:
            compile_chat_template(chat_template)
        except ValueError as exc:
            raise ValueError(f"{exc}; fix the model folder's chat_template.jinja (or tokenizer_config.json's "
                             "chat_template), or register with --no-tokenizer.") from exc
    with transaction.atomic():
        base = _base_model_upsert(base_model_name, hf_config, facts, node_pool=node_pool, max_lora_rank=max_lora_rank,
                                  max_adapter_bytes=max_adapter_bytes)
        if tokenizer_json is not None:
            tokens = dict(special_tokens or {})
            BaseModelTokenizer.objects.update_or_create(
                base_model=base, defaults={"tokenizer_json": tokenizer_json, "chat_template": chat_template,
                                           "special_tokens": tokens,
                                           "sha256": tokenizer_files_sha256(tokenizer_json, chat_template, tokens)})
    # Nodes that already heartbeat this model (registered after them) can serve it at once: the fleet links them.
    base_model_registered.send(sender=BaseModel, base_model=base)
    return base


TOKENIZER_MAX_BYTES = 64 * 1024 * 1024  # Llama 3's tokenizer.json is 9 MB, Gemma's 33 MB


def _check_tokenizer_json(text: str) -> None:
    """Raise ValueError unless ``text`` is a ``tokenizer.json`` the ``tokenizers`` library loads (as vLLM's fast
    tokenizer does), within :data:`TOKENIZER_MAX_BYTES`."""
    from tokenizers import Tokenizer  # only registration needs it

    if len(text.encode()) > TOKENIZER_MAX_BYTES:
        raise ValueError(f"tokenizer.json is over {TOKENIZER_MAX_BYTES // 2**20} MiB; register the model without it "
                         "(--no-tokenizer): the gateway then asks the engine to count prompts.")
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception for every parse error
        raise ValueError(f"tokenizer.json does not load with the tokenizers library ({exc}); give the model's own "
                         "tokenizer.json (saved by transformers' save_pretrained) or register with --no-tokenizer."
                         ) from exc


def _base_model_upsert(base_model_name: str, hf_config: Mapping[str, Any], facts: BaseModelFacts, *, node_pool: str,
                       max_lora_rank: int, max_adapter_bytes: int) -> BaseModel:
    base, _ = BaseModel.objects.update_or_create(
        base_model_name=base_model_name,
        defaults={
            "architecture": facts.architecture,
            "hf_config": dict(hf_config),
            "facts": facts.to_dict(),
            "node_pool": node_pool,
            "max_lora_rank": max_lora_rank,
            "max_adapter_bytes": max_adapter_bytes,
        },
    )
    return base


def adapter_create(tenant: Tenant, *, name: str, base_model_name: str, description: str = "") -> Adapter:
    """Create a tenant adapter, within the tenant's ``max_adapters`` quota.

    Raises:
        QuiverError: ``base_model_not_found`` (400), ``adapter_exists`` (409), ``adapter_name_reserved`` (409: a base
            model's name, which the gateway would route to the base model), ``quota_exceeded`` (403),
            ``invalid`` (400, bad name or description).
    """
    base = BaseModel.objects.filter(base_model_name=base_model_name).first()
    if base is None:
        known = list(BaseModel.objects.values_list("base_model_name", flat=True))
        raise QuiverError(
            f"Unknown base_model '{clip(base_model_name)}'. Registered base models: {known}.", code="base_model_not_found",
            fields={"base_model": [f"Use one of {known}."]},
        )
    if BaseModel.objects.filter(base_model_name=name).exists():
        raise QuiverError(f"'{name}' is a base model's name; choose another adapter name.",
                          code="adapter_name_reserved", status_code=409)
    adapter = Adapter(tenant=tenant, name=name, base_model=base, description=description)
    try:
        adapter.full_clean(validate_unique=False, validate_constraints=False)  # the insert enforces uniqueness
    except DjangoValidationError as exc:
        fields = exc.message_dict
        first = next(iter(fields))
        raise QuiverError(f"Invalid {first} '{clip(name)}': {fields[first][0]}", code="invalid", fields=fields) from exc
    try:
        with transaction.atomic():
            # The tenant row lock makes count-then-insert race-free (two requests cannot both take the last slot).
            locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
            if Adapter.objects.filter(tenant=tenant).count() >= locked.max_adapters:
                raise QuiverError(
                    f"Tenant quota of {locked.max_adapters} adapters reached; delete one or ask an operator to raise "
                    "max_adapters.", code="quota_exceeded", status_code=403)
            adapter.save()
    except IntegrityError as exc:
        raise QuiverError(f"Adapter '{name}' already exists.", code="adapter_exists", status_code=409) from exc
    return adapter


def _adapter_for_upload(tenant: Tenant, *, name: str, base_model_name: str | None) -> Adapter:
    """The tenant's adapter ``name``, created with ``base_model_name`` if missing (concurrent first uploads agree)."""
    adapter = Adapter.objects.select_related("base_model").filter(tenant=tenant, name=name).first()
    if adapter is not None:
        if base_model_name and adapter.base_model.base_model_name != base_model_name:
            raise QuiverError(
                f"Adapter '{name}' is for base model '{adapter.base_model.base_model_name}', not '{base_model_name}'; "
                "omit base_model or upload under a new adapter name.", code="base_model_mismatch", status_code=409,
                fields={"base_model": [f"Must be '{adapter.base_model.base_model_name}' for this adapter."]},
            )
        return adapter
    try:
        return adapter_create(tenant, name=name, base_model_name=base_model_name or "")
    except QuiverError as exc:
        if exc.code != "adapter_exists":
            raise
        return Adapter.objects.get(tenant=tenant, name=name)


def adapter_delete(tenant: Tenant, *, adapter: Adapter) -> None:
    """Delete a tenant's adapter with all its versions: rows now, then (on commit) its S3 objects and engine copies.

    The adapter row lock (the one uploads take) keeps a concurrent upload from adding a version whose objects would
    be missed. The S3 objects and node copies become ``Purge`` rows in the same transaction (``adapters_app.purge``).
    """
    adapter_id = adapter.pk
    with transaction.atomic():
        adapter = Adapter.objects.select_for_update().get(pk=adapter_id, tenant=tenant)
        keys = [f["s3_key"] for v in adapter.versions.all() for f in v.files]
        # Durable records, committed with the delete; a reconciler finishes them however long S3 or a node is down.
        # The fleet records its node copies' purges (purge_node_copy) while the placement rows still exist.
        adapter_deleting.send(sender=Adapter, adapter=adapter)
        adapter.delete()
        purge_s3_keys(keys, reason="adapter_deleted")
    logger.info("adapter.deleted", extra={"adapter_id": adapter_id, "objects": len(keys)})


def _check_version_quota(tenant: Tenant, adapter: Adapter) -> None:
    if adapter.versions.count() >= tenant.max_versions_per_adapter:
        raise QuiverError(
            f"Adapter '{adapter.name}' has reached the quota of {tenant.max_versions_per_adapter} versions; upload "
            "under a new adapter name, delete this adapter, or ask an operator to raise max_versions_per_adapter.",
            code="quota_exceeded", status_code=403)


def _check_storage_quota(tenant: Tenant, *, adding: int) -> None:
    """Refuse when the tenant's stored versions plus ``adding`` bytes would pass ``max_stored_bytes``."""
    used = AdapterVersion.objects.filter(tenant=tenant).aggregate(total=Sum("size_bytes"))["total"] or 0
    if used + adding > tenant.max_stored_bytes or (adding == 0 and used >= tenant.max_stored_bytes):
        raise QuiverError(
            f"Tenant storage quota of {tenant.max_stored_bytes} bytes would be exceeded ({used} stored, {adding} "
            "more); delete adapters or ask an operator to raise max_stored_bytes.",
            code="quota_exceeded", status_code=403)


def _rejected(exc: UploadRejected) -> QuiverError:
    report = {"ok": False, "problems": [p.to_dict() for p in exc.problems], "facts": {}, "schema": 1}
    first = exc.problems[0]
    return QuiverError(
        f"Upload rejected: {first.message} {first.hint}",
        code=first.code,
        fields={"status": "rejected", "validation_report": report},
    )


def _is_archive(upload: UploadedFile) -> bool:
    return (upload.name or "").lower().endswith(ARCHIVE_SUFFIXES)


@contextmanager
def _local_path(upload: UploadedFile) -> Iterator[Path]:
    """A disk path for an uploaded file (Django keeps large ones on disk already; small ones are spooled)."""
    if hasattr(upload, "temporary_file_path"):
        yield Path(upload.temporary_file_path())
        return
    with tempfile.NamedTemporaryFile(suffix=".upload") as tmp:
        for chunk in upload.chunks():
            tmp.write(chunk)
        tmp.flush()
        yield Path(tmp.name)


# The engine reads exactly these (vllm/lora/peft_helper.py, vllm/lora/models.py); other files (model cards, training
# logs, junk) are not stored, so nodes stage only what they load.
SERVED_FILES = (CONFIG_NAME, WEIGHTS_NAME)


def _members(upload_files: Sequence[UploadedFile], stack: ExitStack) -> Iterator[tuple[str, IO[bytes]]]:
    """``(name, stream)`` for each served file of the upload (one archive, or loose files), after intake checks."""
    if len(upload_files) == 1 and _is_archive(upload_files[0]):
        path = stack.enter_context(_local_path(upload_files[0]))
        for member in iter_archive(
            path, max_members=settings.QUIVER_MAX_ARCHIVE_MEMBERS, max_total_bytes=settings.QUIVER_MAX_UPLOAD_BYTES
        ):
            if member.name in SERVED_FILES:
                yield member.name, stack.enter_context(member.open())
        return
    check_upload_names([f.name or "" for f in upload_files])
    for f in upload_files:
        if f.name in SERVED_FILES:
            f.seek(0)
            yield f.name, f


def _content_sha256(files: Sequence[Mapping[str, Any]]) -> str:
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda e: e["name"]):
        digest.update(f"{entry['name']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest()


def adapter_version_upload(
    tenant: Tenant,
    *,
    adapter_name: str,
    upload_files: Sequence[UploadedFile],
    base_model_name: str | None = None,
    on_ready: Mapping[str, Any] | None = None,
) -> tuple[AdapterVersion, bool]:
    """Stream an uploaded PEFT folder to S3 and record an immutable version, enqueueing its validation.

    The adapter is created on first upload when ``base_model_name`` is given. Bytes go to S3 chunk by chunk with
    a running sha256 (never whole in memory); the version row and the enqueue happen in one transaction
    (``transaction.on_commit``). Identical bytes return the existing version. Any failure deletes what was stored.

    Args:
        upload_files: the folder's files (multipart), or exactly one zip/tar archive of it.
        on_ready: what the version does once ready (``{"promote": True}`` or ``{"canary": percent}``;
            ``adapters_app.serving.serving_on_ready``); None = it takes no traffic until promoted.

    Returns:
        ``(version, created)``; ``created`` is False when identical bytes were already uploaded.

    Raises:
        QuiverError: ``adapter_not_found`` (404) when the adapter is missing and no ``base_model`` was given;
            intake rejections (unsafe archive, pickle weights, missing files: 400, code from the validator);
            ``upload_too_large`` (413); ``storage_unavailable`` (503).
    """
    if not upload_files:
        raise QuiverError("No files were uploaded; send the adapter folder's files or one archive as 'files'.",
                          code="no_files", fields={"files": ["This field is required."]})
    adapter = Adapter.objects.filter(tenant=tenant, name=adapter_name).first()
    if adapter is None and not base_model_name:
        raise QuiverError(
            f"Adapter '{adapter_name}' does not exist; pass 'base_model' to create it with this upload.",
            code="adapter_not_found",
            status_code=404,
        )
    _check_storage_quota(tenant, adding=0)  # early: a tenant at its quota streams nothing to S3
    prefix = f"tenants/{tenant.pk}/uploads/{uuid.uuid4().hex}/"
    stored: list[storage.StoredObject] = []
    remaining = settings.QUIVER_MAX_UPLOAD_BYTES
    try:
        with ExitStack() as stack:
            for name, stream in _members(upload_files, stack):
                obj = storage.put_stream(prefix + name, stream, limit=remaining)
                stored.append(obj)
                remaining -= obj.size
        version, created = adapter_version_record(
            tenant, adapter_name=adapter_name, base_model_name=base_model_name, prefix=prefix, stored=stored,
            on_ready=on_ready)
    except UploadRejected as exc:
        storage.delete_keys(o.key for o in stored)
        raise _rejected(exc) from exc
    except storage.SizeLimitExceeded as exc:
        storage.delete_keys(o.key for o in stored)
        raise QuiverError(
            f"Upload exceeds {exc.limit} bytes; ask an operator to raise QUIVER_MAX_UPLOAD_BYTES or shrink the adapter.",
            code="upload_too_large", status_code=413,
        ) from exc
    except (BotoCoreError, ClientError) as exc:
        logger.warning("adapter_version.storage_failed", extra={"tenant": tenant.slug, "error": str(exc)})
        with contextlib.suppress(BotoCoreError, ClientError):
            storage.delete_keys(o.key for o in stored)
        raise QuiverError("Artifact storage is unavailable; nothing was stored. Retry the upload shortly.",
                          code="storage_unavailable", status_code=503) from exc
    except BaseException:
        storage.delete_keys(o.key for o in stored)
        raise
    if not created:
        return version, False
    logger.info("adapter_version.uploaded", extra={"version_id": version.pk, "sha256": version.sha256,
                                                  "tenant": tenant.slug})
    return version, True


def adapter_version_record(
    tenant: Tenant,
    *,
    adapter_name: str,
    base_model_name: str | None,
    prefix: str,
    stored: Sequence[storage.StoredObject],
    on_ready: Mapping[str, Any] | None = None,
) -> tuple[AdapterVersion, bool]:
    """Record objects already in S3 under ``prefix`` as a new version, enqueueing its validation on commit.

    Shared by the through-Django upload and the browser-direct one (``adapters_app.direct_upload``). Quotas, the
    version number and duplicate detection are decided under the tenant and adapter row locks. Identical bytes
    return the existing version (its new copies are deleted; a rejected one is validated again).

    Returns:
        ``(version, created)``.

    Raises:
        QuiverError: ``quota_exceeded`` (403), ``base_model_mismatch`` (409), ``base_model_not_found`` (400); the
            caller deletes ``stored``.
    """
    files = [{"name": o.key[len(prefix) :], "size": o.size, "sha256": o.sha256, "s3_key": o.key} for o in stored]
    sha256 = _content_sha256(files)
    with transaction.atomic():
        adapter = _adapter_for_upload(tenant, name=adapter_name, base_model_name=base_model_name)
        # Lock order tenant → adapter (as adapter_create): quotas, version numbering and duplicate detection.
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        adapter = Adapter.objects.select_for_update().get(pk=adapter.pk)
        existing = adapter.versions.filter(sha256=sha256).first()
        if existing is None:
            _check_version_quota(locked, adapter)
            _check_storage_quota(locked, adding=sum(o.size for o in stored))
            number = (adapter.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
            version = AdapterVersion(
                tenant=tenant, adapter=adapter, number=number, sha256=sha256,
                size_bytes=sum(o.size for o in stored), s3_prefix=prefix, files=files,
                on_ready=dict(on_ready) if on_ready else None,
            )
            version.full_clean()
            version.save()
            enqueue_on_commit(schedule.VALIDATE, version.pk)
    if existing is not None:
        storage.delete_keys(o.key for o in stored)
        if existing.status == AdapterVersion.Status.REJECTED and existing.files:
            existing = adapter_version_revalidate(existing)
        return existing, False
    return version, True


def adapter_version_revalidate(version: AdapterVersion) -> AdapterVersion:
    """Send a ``rejected`` version through validation again (an operator may have raised a limit since).

    Returns:
        The version, now ``uploaded`` with validation enqueued on commit; unchanged unless it was ``rejected``.
    """
    with transaction.atomic():
        if AdapterVersion.objects.filter(pk=version.pk, status=AdapterVersion.Status.REJECTED).update(
            status=AdapterVersion.Status.UPLOADED, validation_report=None, validated_at=None, validation_attempts=0
        ):
            enqueue_on_commit(schedule.VALIDATE, version.pk)
    version.refresh_from_db()
    return version


def adapter_version_fail(version: AdapterVersion, *, code: str, message: str, hint: str) -> AdapterVersion:
    """End a version's validation as ``rejected`` for a reason outside the adapter (storage down, retries spent).

    Re-uploading the same bytes validates it again (see :func:`adapter_version_upload`).
    """
    report = {"ok": False, "facts": {}, "schema": 1,
              "problems": [{"code": code, "severity": "error", "field": None, "message": message, "hint": hint}]}
    AdapterVersion.objects.filter(pk=version.pk, status__in=[AdapterVersion.Status.UPLOADED,
                                                             AdapterVersion.Status.VALIDATING]).update(
        status=AdapterVersion.Status.REJECTED, validation_report=report, validated_at=timezone.now())
    version.refresh_from_db()
    return version


def adapter_version_validate(version: AdapterVersion) -> AdapterVersion:
    """Validate a stored version against its base model and pool limits; set ``ready`` or ``rejected``.

    Idempotent: a version already ``ready``/``rejected`` is returned unchanged; a redelivered ``validating`` one is
    validated again (the validator is a pure function of the bytes).
    """
    claimed = AdapterVersion.objects.filter(
        pk=version.pk, status__in=[AdapterVersion.Status.UPLOADED, AdapterVersion.Status.VALIDATING]
    ).update(status=AdapterVersion.Status.VALIDATING, validation_claimed_at=timezone.now(),
             validation_attempts=F("validation_attempts") + 1)
    if not claimed:
        version.refresh_from_db()
        return version
    version.refresh_from_db(fields=["validation_attempts"])
    if version.validation_attempts > settings.QUIVER_VALIDATION_MAX_ATTEMPTS:
        # Earlier attempts never finished (the worker died each time): this adapter must not take workers down forever.
        return adapter_version_fail(
            version, code="validation_crashed",
            message=f"Validation did not finish in {settings.QUIVER_VALIDATION_MAX_ATTEMPTS} attempts.",
            hint="Check the adapter for unusual sizes or patterns, or contact support with the version number.")
    base = version.adapter.base_model
    with tempfile.TemporaryDirectory(prefix="quiver-validate-") as tmp:
        root = Path(tmp)
        problems_io: list[dict[str, Any]] = []
        for entry in version.files:
            target = root / entry["name"]
            target.parent.mkdir(parents=True, exist_ok=True)
            if storage.download_to(entry["s3_key"], target) != entry["sha256"]:
                problems_io.append({"code": "artifact_corrupt", "severity": "error", "field": entry["name"],
                                    "message": f"{entry['name']} changed in storage since upload.",
                                    "hint": "Upload the adapter again."})
        try:
            report = validate_adapter_dir(
                root,
                base=BaseModelFacts.from_dict(base.facts),
                limits=PoolLimits(max_lora_rank=base.max_lora_rank, max_adapter_bytes=base.max_adapter_bytes),
            ).to_dict()
        except Exception:
            # A validator bug must not strand the version in "validating": reject it, keep the traceback in logs.
            logger.exception("adapter_version.validator_crashed", extra={"version_id": version.pk})
            report = {"ok": False, "facts": {}, "schema": 1, "problems": [{
                "code": "validator_internal_error", "severity": "error", "field": None,
                "message": "The validator failed on this adapter; operators have the details in the logs.",
                "hint": "Check adapter_config.json for unusual values, or contact support with the version number.",
            }]}
    report["problems"] = problems_io + report.get("problems", [])
    ok = report.get("ok", False) and not problems_io
    report["ok"] = ok
    facts = report.get("facts", {})
    version.status = AdapterVersion.Status.READY if ok else AdapterVersion.Status.REJECTED
    version.validation_report = report
    version.r = facts.get("r") if isinstance(facts.get("r"), int) and 0 < facts["r"] < 2**31 else None
    alpha = facts.get("lora_alpha")
    version.lora_alpha = float(alpha) if isinstance(alpha, float) or (isinstance(alpha, int) and abs(alpha) < 2**53) else None
    version.target_modules = facts.get("target_modules")
    version.validated_at = timezone.now()
    version.save(update_fields=["status", "validation_report", "r", "lora_alpha", "target_modules", "validated_at"])
    logger.info("adapter_version.validated", extra={"version_id": version.pk, "status": version.status})
    return version


NO_EFFECT_MESSAGE = ("A node's effect probe found this version changes nothing: greedy output and logprobs on a fixed "
                     "prompt equal the base model's, so it would serve as the base model.")


def adapter_version_effect_record(version: AdapterVersion, *, verdict: str, served: bool) -> AdapterVersion:
    """Record a node's effect probe verdict in the version's report, as ``validation_report["effect_probe"]`` =
    ``{"verdict", "served"}``; ``no_effect`` also adds the problem ``no_effect`` (an error when the version is not
    served because of it, a warning when validation had already warned ``adapter_untrained``).

    Idempotent: the same verdict writes nothing. The row is locked so concurrent warms on two nodes do not lose a
    write. ``verdict`` is the agent's (``changed``, ``no_effect``); others are ignored.
    """
    if verdict not in ("changed", "no_effect"):
        return version
    with transaction.atomic():
        locked = AdapterVersion.objects.select_for_update().get(pk=version.pk)
        report = dict(locked.validation_report or {})
        wanted = {"verdict": verdict, "served": served}
        if report.get("effect_probe") == wanted:
            return locked
        problems = [p for p in report.get("problems", []) if p.get("code") != "no_effect"]
        if verdict == "no_effect":
            problems.append({"code": "no_effect", "severity": "warning" if served else "error",
                             "field": WEIGHTS_NAME, "message": NO_EFFECT_MESSAGE,
                             "hint": "Check that the adapter was trained and exported with its trained weights "
                                     "(lora_B must not cancel lora_A), then upload it again."})
        report.update(effect_probe=wanted, problems=problems)
        locked.validation_report = report
        locked.save(update_fields=["validation_report"])
    logger.info("adapter_version.effect_probe", extra={"version_id": version.pk, "verdict": verdict,
                                                       "served": served})
    return locked
