"""Usage records (one per proxied request) and their per-minute rollups.

The tables keep the names they had when these models lived in the ``gateway`` app (``db_table``). Node references are
by app label (``"fleet.Node"``): metering never imports the fleet.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from adapters_app.models import AdapterVersion, BaseModel
from tenants.models import ApiKey, Tenant


class UsageRecord(models.Model):
    """One proxied request's token counts, per tenant, key and adapter version (null = the base model).

    Written in batches off the request path (``metering.usage_drain``); ``request_id`` makes a redelivered batch a
    no-op, and ``created_at`` is when the request arrived, not when the row was written. ``status_code`` 499 = the
    client went away mid-stream, 502 = the engine died; tokens are those actually sent either way.
    """

    # Indexed by (tenant, created_at) below, whose prefix serves every tenant-only lookup too.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage", db_index=False)
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL)
    adapter_version = models.ForeignKey(AdapterVersion, null=True, on_delete=models.SET_NULL, related_name="usage")
    base_model = models.ForeignKey(BaseModel, null=True, on_delete=models.SET_NULL)
    node = models.ForeignKey("fleet.Node", null=True, on_delete=models.SET_NULL)
    # Names at request time, so billing survives the adapter's deletion (the FK then becomes null).
    model_name = models.CharField(max_length=200, default="")
    version_number = models.PositiveIntegerField(null=True)
    endpoint = models.CharField(max_length=40)
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField()
    ttft_ms = models.FloatField(null=True, blank=True)
    # Unique through a constraint, not the field: a unique CharField also gets PostgreSQL a `varchar_pattern_ops`
    # index for LIKE, which no query uses (695 MB per 10 million records, docs/scale-usage.md).
    request_id = models.CharField(max_length=40, null=True, blank=True)  # noqa: DJ001 (NULLs never collide)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "gateway_usagerecord"
        # Every usage read is one tenant's rows over a period (docs/scale-usage.md, "Usage at a year of traffic").
        indexes = [models.Index(fields=["tenant", "created_at"], name="usagerecord_tenant_created")]
        constraints = [models.UniqueConstraint(fields=["request_id"], name="usagerecord_request_id_unique")]

    def __str__(self) -> str:
        return f"{self.endpoint}:{self.status_code}"


class UsageRollup(models.Model):
    """One minute of one tenant's traffic to one model (adapter version, or the base model when
    ``version_number`` is null), summarised from :class:`UsageRecord` by ``inference.metering.rollups.usage_rollup``.

    Minutes are UTC, by request arrival; ``errors`` counts statuses >= 400 (499 and 502 included); latencies are
    PostgreSQL ``percentile_cont`` over the minute's records, TTFT over its streamed records (null when none streamed).
    Recomputed while the minute is inside ``QUIVER_USAGE_ROLLUP_LOOKBACK_S``, so late records (a long stream is
    written when it ends) still count; kept after raw records pass ``QUIVER_USAGE_RETENTION_DAYS``.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage_rollups")
    minute = models.DateTimeField(db_index=True)
    model_name = models.CharField(max_length=200)
    version_number = models.PositiveIntegerField(null=True)
    adapter_version = models.ForeignKey(AdapterVersion, null=True, on_delete=models.SET_NULL, related_name="+")
    requests = models.PositiveIntegerField()
    errors = models.PositiveIntegerField()
    prompt_tokens = models.PositiveBigIntegerField()
    completion_tokens = models.PositiveBigIntegerField()
    latency_p50_ms = models.FloatField()
    latency_p95_ms = models.FloatField()
    ttft_p50_ms = models.FloatField(null=True)
    ttft_p95_ms = models.FloatField(null=True)

    class Meta:
        db_table = "gateway_usagerollup"
        indexes = [models.Index(fields=["tenant", "minute"])]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%dT%H:%M} {self.model_name}"


class UsageHour(models.Model):
    """One UTC hour of one tenant's traffic to one model (as :class:`UsageRollup`, by request arrival): the sums the
    long-window reads need (``usage_summary``, hourly ``usage_series``), about 60 times fewer rows than the minutes.

    Kept by ``rollups.usage_rollup`` (every hour touching its lookback window is recomputed from the raw records) and
    kept after the raw records' retention, like the minutes. ``errors`` counts statuses >= 400; ``latency_sum_ms``
    is the sum of the hour's ``latency_ms`` (mean = sum / requests).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    hour = models.DateTimeField()
    model_name = models.CharField(max_length=200)
    version_number = models.PositiveIntegerField(null=True)
    adapter_version = models.ForeignKey(AdapterVersion, null=True, on_delete=models.SET_NULL, related_name="+")
    requests = models.PositiveIntegerField()
    errors = models.PositiveIntegerField()
    prompt_tokens = models.PositiveBigIntegerField()
    completion_tokens = models.PositiveBigIntegerField()
    latency_sum_ms = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "hour"], name="usagehour_tenant_hour")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%dT%H} {self.model_name}"
