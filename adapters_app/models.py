"""Registry: base models, tenants' adapters and their immutable versions.

Vocabulary follows PEFT (``r``, ``lora_alpha``, ``target_modules``) and vLLM (``lora_int_id`` = ``AdapterVersion.pk``,
never ``hash()``: vllm-project/vllm ``vllm/lora/request.py`` requires a positive, globally unique id).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import models

from tenants.models import Tenant, slug_validator


class BaseModel(models.Model):
    """A frozen shared model served by a node pool.

    ``hf_config`` is the model's ``config.json``; ``facts`` is ``BaseModelFacts.to_dict()`` (hidden size, layers and
    per-module shapes) used by the validator. ``max_lora_rank`` and ``max_adapter_bytes`` are the pool's engine limits.
    """

    base_model_name = models.CharField(max_length=200, unique=True)
    architecture = models.CharField(max_length=100)
    hf_config = models.JSONField()
    facts = models.JSONField()
    node_pool = models.CharField(max_length=64, default="default")
    max_lora_rank = models.PositiveIntegerField(default=16)
    max_adapter_bytes = models.PositiveBigIntegerField(default=512 * 1024 * 1024)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.base_model_name


class BaseModelTokenizer(models.Model):
    """A base model's Hugging Face ``tokenizer.json`` (the ``tokenizers`` library's serialisation, the file vLLM's
    fast tokenizer loads), stored at registration so every gateway process counts prompts for tokens-per-minute
    limits with the engine's own tokenizer instead of a ``/tokenize`` round trip (``inference.gateway.prompt_counter``).

    Its own table so reading base models never drags the file (Llama 3's is 9 MB). ``sha256`` is of what a gateway
    loads (:func:`tokenizer_files_sha256`): it re-reads the files only when it changed.
    """

    base_model = models.OneToOneField(BaseModel, on_delete=models.CASCADE, primary_key=True, related_name="tokenizer")
    tokenizer_json = models.TextField()
    # The chat template vLLM renders chats with and the special tokens it hands the template
    # (adapters_app.chat_template); blank: chats are counted by the engine.
    chat_template = models.TextField(blank=True, default="")
    special_tokens = models.JSONField(default=dict, blank=True)
    sha256 = models.CharField(max_length=64)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.base_model_id} tokenizer {self.sha256[:12]}"


class Adapter(models.Model):
    """A tenant's named adapter; ``name`` is unique within the tenant and is what applications send as ``model``."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="adapters")
    name = models.CharField(max_length=40, validators=[slug_validator])
    base_model = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="adapters")
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # The serving rule: which versions ``model = "<name>"`` reaches, ``[[number, weight], ...]`` with weights summing
    # to 100, heaviest first (``inference.policy.versions``); empty until the first version is ready. ``previous_rule``
    # is what a rollback returns to. ``auto_promote``: each new ready version takes all traffic (the old behaviour).
    serving_rule = models.JSONField(default=list, blank=True)
    previous_rule = models.JSONField(null=True, blank=True)
    auto_promote = models.BooleanField(default=False)
    # Per-adapter gateway limits beside the tenant's and the key's (requests/min, tokens/min); null = unlimited.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="adapter_unique_tenant_name")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


def served_name(tenant_slug: str, adapter_name: str, version_pk: int) -> str:
    """``AdapterVersion.served_name`` from its parts, for callers that read them as values (a heartbeat checks the
    names of dozens of versions, and needs no version, adapter and tenant objects for each)."""
    return f"{tenant_slug}--{adapter_name}--{version_pk}"


class AdapterVersion(models.Model):
    """One immutable upload of an adapter.

    ``sha256`` digests the sorted ``(file name, file sha256)`` list, so identical bytes give the same version.
    ``files`` is ``[{"name", "size", "sha256", "s3_key"}]``. Status moves ``uploaded → validating → ready | rejected``.
    ``validation_report`` is ``ValidationReport.to_dict()`` from ``adapters_app.validation``.
    """

    class Status(models.TextChoices):
        UPLOADED = "uploaded"
        VALIDATING = "validating"
        READY = "ready"
        REJECTED = "rejected"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="adapter_versions")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    size_bytes = models.PositiveBigIntegerField()
    s3_prefix = models.CharField(max_length=500)
    files = models.JSONField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.UPLOADED)
    r = models.PositiveIntegerField(null=True, blank=True)
    lora_alpha = models.FloatField(null=True, blank=True)
    target_modules = models.JSONField(null=True, blank=True)
    validation_report = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    # When validation was last claimed, and how many times: the sweeper re-enqueues stuck versions, and a version
    # whose validation keeps killing workers is rejected after QUIVER_VALIDATION_MAX_ATTEMPTS.
    validation_claimed_at = models.DateTimeField(null=True, blank=True)
    validation_attempts = models.PositiveSmallIntegerField(default=0)
    # What the upload asked for once the version is ready: ``{"promote": true}`` or ``{"canary": <percent>}``;
    # null = nothing (it becomes ready without traffic unless it is the adapter's first or auto-promote is on).
    on_ready = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["adapter", "number"], name="version_unique_number"),
            models.UniqueConstraint(fields=["adapter", "sha256"], name="version_unique_sha256"),
        ]
        indexes = [models.Index(fields=["adapter", "status"])]

    # Written once at upload; a changed artifact is a new version (vllm-project/vllm#30931: reusing a name for new
    # weights serves stale prefix-cache blocks).
    IMMUTABLE_FIELDS = frozenset({"tenant", "adapter", "number", "sha256", "size_bytes", "s3_prefix", "files"})

    def __str__(self) -> str:
        return f"{self.adapter_id}@{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; updates must name ``update_fields`` outside the immutable artifact fields.

        Raises:
            ValueError: an update without ``update_fields`` or touching ``IMMUTABLE_FIELDS``.
        """
        if self.pk is not None and not self._state.adding:
            fields = kwargs.get("update_fields")
            if fields is None or self.IMMUTABLE_FIELDS & set(fields):
                raise ValueError("AdapterVersion artifacts are immutable: upload a new version instead.")
        super().save(*args, **kwargs)

    @property
    def lora_int_id(self) -> int:
        """vLLM's engine id for this version: the primary key (positive, globally unique, stable)."""
        return self.pk

    @property
    def served_name(self) -> str:
        """vLLM's ``lora_name`` on nodes: ``<tenant_slug>--<adapter_name>--<version pk>``; never shown to tenants."""
        return served_name(self.adapter.tenant.slug, self.adapter.name, self.pk)


class ServingChange(models.Model):
    """One change of an adapter's serving rule, for the tenant's audit trail: who, when, what, before → after.

    ``actor`` is a username or ``key:<key_id>`` (or ``system`` for a first version or auto-promotion); ``action``
    is ``promote``, ``canary``, ``rollback``, ``first_ready``, ``auto_promote``, ``upload_promote``, ``upload_canary``
    or ``version_gone``; ``before``/``after`` are rules as stored on :class:`Adapter`.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="serving_changes")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="serving_changes")
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=20)
    before = models.JSONField(default=list)
    after = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.adapter_id}:{self.action}"


class Purge(models.Model):
    """A durable cleanup that must finish however long a part is down (``adapters_app.purge``).

    ``kind`` ``s3``: delete ``s3_keys``. ``kind`` ``node``: remove ``lora_name`` from node ``node_id``'s engine and disk
    (no foreign key: a node deleted meanwhile means nothing is left to clean). Written in the transaction that
    makes the objects garbage; retried with backoff until ``done_at`` is set.
    """

    class Kind(models.TextChoices):
        S3 = "s3"
        NODE = "node"

    kind = models.CharField(max_length=8, choices=Kind.choices)
    s3_keys = models.JSONField(default=list, blank=True)
    node_id = models.BigIntegerField(null=True, blank=True)
    lora_name = models.CharField(max_length=200, blank=True, default="")
    reason = models.CharField(max_length=40)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    next_attempt_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True, db_index=True)

    def __str__(self) -> str:
        return f"purge {self.kind} {self.pk} ({self.reason})"


class Upload(models.Model):
    """A browser-direct upload in progress: S3 multipart uploads the server created, one per declared file.

    The client declares each file's ``name``, ``size`` (bytes) and ``sha256`` up front; the server picks every key
    (``tenants/<tenant pk>/uploads/<public id>/<name>``), signs part URLs bound to their exact lengths, completes each
    file itself, and a worker checks the sha256 before the version exists (``adapters_app.direct_upload``).
    ``files`` is ``[{"name", "size", "sha256", "key", "upload_id", "completed"}]``. State moves
    ``open → verifying → done | failed``, or ``open → aborted`` (cancelled, or expired and swept).
    """

    class State(models.TextChoices):
        OPEN = "open"
        VERIFYING = "verifying"
        DONE = "done"
        FAILED = "failed"
        ABORTED = "aborted"

    public_id = models.CharField(max_length=32, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="uploads")
    adapter_name = models.CharField(max_length=40)
    base_model_name = models.CharField(max_length=200, blank=True, default="")
    part_size = models.PositiveBigIntegerField()
    files = models.JSONField()
    state = models.CharField(max_length=12, choices=State.choices, default=State.OPEN)
    version = models.ForeignKey(AdapterVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)
    verify_claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "expires_at"])]

    def __str__(self) -> str:
        return f"upload {self.public_id} ({self.state})"

    @property
    def prefix(self) -> str:
        """The S3 prefix every key of this upload lives under."""
        return f"tenants/{self.tenant_id}/uploads/{self.public_id}/"


def tokenizer_files_sha256(tokenizer_json: str, chat_template: str = "", special_tokens: dict[str, str] | None = None
                           ) -> str:
    """The digest :class:`BaseModelTokenizer` keeps of what it holds: of ``tokenizer_json`` alone when there is no
    chat template or special token (the digest of rows stored before they existed), else of the three together."""
    if not chat_template and not special_tokens:
        return hashlib.sha256(tokenizer_json.encode()).hexdigest()
    extra = json.dumps([chat_template, special_tokens or {}], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(tokenizer_json.encode() + b"\0" + extra.encode()).hexdigest()
