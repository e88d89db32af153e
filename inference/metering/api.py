"""Control-plane API for metering: ``GET /api/v1/usage[?since=…&until=…]``, ``…/series``, ``…/traffic``,
``…/rollups``, ``…/versions`` (one adapter's versions side by side).

Every ``since``/``until`` is ISO 8601 or a span back from now (``15m``, ``1h``, ``24h``, ``7d``: ``common.moments``);
anything else is a 400 ``invalid`` naming the field and both forms.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.db.models import QuerySet
from django.http import Http404, StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from adapters_app.selectors import adapter_get
from common.moments import MomentField
from inference.metering.models import UsageHour, UsageRecord, UsageRollup
from inference.metering.rollups import usage_rollups
from inference.metering.selectors import usage_csv, usage_summary
from inference.metering.series import BUCKETS, usage_series
from inference.metering.traffic import MAX_BUCKETS, traffic_table
from inference.metering.usage import usage_drain
from inference.metering.versions import version_figures
from tenants.viewsets import TenantScopedViewSet

logger = logging.getLogger(__name__)


def drain_quietly() -> None:
    """Move what the gateway metered into PostgreSQL before answering (a few batches; Redis errors only log)."""
    try:
        usage_drain(max_batches=5)
    except redis.RedisError as exc:  # the stream waits for the next beat tick; answer from what is stored
        logger.warning("usage.drain_failed", extra={"error": str(exc)})



CSV_BATCH_LINES = 2000


async def _in_batches(lines: Iterator[str]) -> AsyncIterator[str]:
    """Serve a sync line iterator to the ASGI server in batches, each read in the request's thread (its database
    cursor lives there). Given the sync iterator itself, Django's ASGI handler first reads it whole into a list
    (``StreamingHttpResponse.__aiter__``), so a large export was held in memory before its first byte went out."""
    def take() -> str:
        batch = []
        for line in lines:
            batch.append(line)
            if len(batch) >= CSV_BATCH_LINES:
                break
        return "".join(batch)

    while chunk := await sync_to_async(take, thread_sensitive=True)():
        yield chunk

class UsageQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/usage``: optional ``since`` and ``until`` (ISO 8601 or ``24h``; ``until`` exclusive), and
    ``export=csv`` for the raw records."""
    since = MomentField(required=False)
    until = MomentField(required=False)
    export = serializers.ChoiceField(choices=["csv"], required=False, help_text="csv: the raw records as CSV")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``since`` must come before ``until``."""
        if attrs.get("since") and attrs.get("until") and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": "must be after 'since'."})
        return attrs


class UsageSeriesQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/usage/series``: ``since`` (default: an hour ago) and ``bucket`` (minute, hour)."""
    since = MomentField(required=False)
    bucket = serializers.ChoiceField(choices=sorted(BUCKETS), default="minute")


class UsageRollupQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/usage/rollups``: ``since`` (default: an hour ago), ``until`` (exclusive, optional),
    ``model`` (one adapter or the base model, optional)."""
    since = MomentField(required=False)
    until = MomentField(required=False)
    model = serializers.CharField(required=False, max_length=200)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``since`` must come before ``until``."""
        if attrs.get("since") and attrs.get("until") and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": "must be after 'since'."})
        return attrs


class UsageRollupRowSerializer(serializers.Serializer):
    """One minute of one model's traffic (see ``rollups.usage_rollups``)."""
    minute = serializers.DateTimeField(help_text="start of the UTC minute, by request arrival")
    model = serializers.CharField()
    version = serializers.IntegerField(allow_null=True, help_text="adapter version; null = the base model")
    requests = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="requests answered with status >= 400 (as in /usage/series)")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_p50_ms = serializers.FloatField()
    latency_p95_ms = serializers.FloatField()
    ttft_p50_ms = serializers.FloatField(allow_null=True, help_text="streamed requests only; null when none")
    ttft_p95_ms = serializers.FloatField(allow_null=True)


class UsageRowSerializer(serializers.Serializer):
    """One row of ``GET /api/v1/usage`` (see ``usage_summary``)."""
    model = serializers.CharField()
    adapter = serializers.CharField(allow_null=True)
    version = serializers.IntegerField(allow_null=True)
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class UsageSeriesRowSerializer(serializers.Serializer):
    """One row of ``GET /api/v1/usage/series`` (see ``usage_series``)."""
    t = serializers.DateTimeField()
    model = serializers.CharField()
    requests = serializers.IntegerField()
    failures = serializers.IntegerField(help_text="requests answered with status >= 400")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms_avg = serializers.FloatField()


class TrafficQuerySerializer(serializers.Serializer):
    """Query of the traffic tables: ``since`` (default an hour ago), ``until`` (default now), ``bucket`` of the
    sparklines (default minute up to 6 h, else hour); operators may filter by ``tenant`` slug."""

    since = MomentField(required=False)
    until = MomentField(required=False)
    bucket = serializers.ChoiceField(choices=["minute", "hour"], required=False)
    tenant = serializers.SlugField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults; ``since`` before ``until``; at most 1,440 buckets."""
        until = attrs.get("until") or timezone.now()
        since = attrs.get("since") or until - timedelta(hours=1)
        if since >= until:
            raise serializers.ValidationError({"until": "must be after 'since'."})
        bucket = attrs.get("bucket") or ("minute" if until - since <= timedelta(hours=6) else "hour")
        width = timedelta(minutes=1) if bucket == "minute" else timedelta(hours=1)
        if (until - since) / width > MAX_BUCKETS:
            raise serializers.ValidationError({"bucket": f"more than {MAX_BUCKETS} {bucket} buckets; use 'hour' or a "
                                               "shorter period."})
        return {**attrs, "since": since, "until": until, "bucket": bucket}


class VersionsQuerySerializer(serializers.Serializer):
    """Query of ``GET /api/v1/usage/versions``: the ``adapter`` (name), ``since`` (default an hour ago), ``until``
    (default now)."""

    adapter = serializers.SlugField(max_length=40)
    since = MomentField(required=False)
    until = MomentField(required=False)


class VersionFiguresSerializer(serializers.Serializer):
    """One version's figures (``inference.metering.versions.version_figures``); latencies in ms."""

    version = serializers.IntegerField()
    status = serializers.CharField()
    weight = serializers.IntegerField(help_text="percent of model=<name> it takes now; 0 out of the rule")
    in_rule = serializers.BooleanField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField(help_text="requests answered with status >= 400")  # type: ignore[assignment]
    error_rate = serializers.FloatField(allow_null=True)
    ttft_ms_p50 = serializers.FloatField(allow_null=True)
    ttft_ms_p95 = serializers.FloatField(allow_null=True)
    latency_ms_p50 = serializers.FloatField(allow_null=True)
    latency_ms_p95 = serializers.FloatField(allow_null=True)
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class TrafficRowSerializer(serializers.Serializer):
    """One row of a traffic table (``inference.metering.traffic.traffic_table``); latencies in ms."""

    tenant = serializers.CharField()
    model = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    requests = serializers.IntegerField()
    requests_per_s = serializers.FloatField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    tokens_per_s = serializers.FloatField()
    failures = serializers.IntegerField(help_text="requests answered with status >= 400")
    latency_ms_p50 = serializers.FloatField(allow_null=True)
    latency_ms_p95 = serializers.FloatField(allow_null=True)
    latency_ms_p99 = serializers.FloatField(allow_null=True)
    ttft_ms_p50 = serializers.FloatField(allow_null=True)
    ttft_ms_p95 = serializers.FloatField(allow_null=True)
    spark = serializers.ListField(child=serializers.IntegerField(), help_text="requests per bucket")


def traffic_response(records: QuerySet[UsageRecord], request: Request,
                     hours: QuerySet[UsageHour] | None = None) -> Response:
    """Validate the traffic query and answer the table for ``records`` (and ``hours``, scoped alike, when given)."""
    query = TrafficQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    q = query.validated_data
    if q.get("tenant"):
        records = records.filter(tenant__slug=q["tenant"])
        hours = None if hours is None else hours.filter(tenant__slug=q["tenant"])
    return Response(traffic_table(records, since=q["since"], until=q["until"], bucket=q["bucket"], hours=hours))


class UsageViewSet(TenantScopedViewSet):
    """The caller's token usage per adapter version (and per base model), as metered by the gateway."""

    queryset = UsageRecord.objects.all()
    serializer_class = UsageRowSerializer
    pagination_class = None
    adapter_field = "adapter_version__adapter__name"  # a limited key sees its adapters' rows, no base-model rows

    @extend_schema(parameters=[UsageQuerySerializer], responses=UsageRowSerializer(many=True))
    def list(self, request: Request) -> Response | StreamingHttpResponse:
        """``GET /api/v1/usage``: token totals per adapter version (see ``usage_summary``); with ``export=csv``, the
        raw records in the range as a CSV download instead (``usage_csv``)."""
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        drain_quietly()  # what the gateway metered a moment ago is in the answer, not a beat tick later
        since, until = query.validated_data.get("since"), query.validated_data.get("until")
        if query.validated_data.get("export") == "csv":
            response = StreamingHttpResponse(_in_batches(usage_csv(self.get_queryset(), since=since, until=until)),
                                             content_type="text/csv")
            response["Content-Disposition"] = 'attachment; filename="usage.csv"'
            return response
        return Response(usage_summary(self.get_queryset(), since=since, until=until, hours=self._hours()))

    def _hours(self) -> QuerySet[UsageHour]:
        """The hourly sums scoped as ``get_queryset`` scopes the records (tenant, the key's adapters)."""
        return self.within_key_adapters(UsageHour.objects.filter(tenant=self.tenant), "adapter_version__adapter__name")


    @extend_schema(parameters=[UsageSeriesQuerySerializer], responses=UsageSeriesRowSerializer(many=True))
    @action(detail=False, methods=["get"])
    def series(self, request: Request) -> Response:
        """``GET /api/v1/usage/series``: requests, tokens, errors and latency per model per bucket (charts)."""
        query = UsageSeriesQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        drain_quietly()
        since = query.validated_data.get("since") or timezone.now() - timedelta(hours=1)
        return Response(usage_series(self.get_queryset(), since=since, bucket=query.validated_data["bucket"],
                                     hours=self._hours()))

    @extend_schema(parameters=[TrafficQuerySerializer], responses=TrafficRowSerializer(many=True))
    @action(detail=False, methods=["get"])
    def traffic(self, request: Request) -> Response:
        """``GET /api/v1/usage/traffic``: per adapter version over a period: requests, tokens, errors, latency and
        TTFT percentiles, a sparkline (``inference.metering.traffic.traffic_table``); most requests first."""
        drain_quietly()
        return traffic_response(self.get_queryset(), request, hours=self._hours())

    @extend_schema(parameters=[VersionsQuerySerializer], responses=VersionFiguresSerializer(many=True))
    @action(detail=False, methods=["get"])
    def versions(self, request: Request) -> Response:
        """``GET /api/v1/usage/versions?adapter=<name>``: each version of the adapter in its serving rule or with
        traffic, side by side over the period (default the last hour): requests, errors, TTFT and latency p50/p95,
        tokens, weight. 404 when the caller has no such adapter."""
        query = VersionsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        self.adapter_in_reach(q["adapter"])
        adapter = adapter_get(self.tenant, name=q["adapter"])
        if adapter is None:
            raise Http404
        drain_quietly()
        until = q.get("until") or timezone.now()
        since = q.get("since") or until - timedelta(hours=1)
        return Response(version_figures(self.get_queryset(), adapter=adapter, since=since, until=until,
                                        hours=self._hours()))

    @extend_schema(parameters=[UsageRollupQuerySerializer], responses=UsageRollupRowSerializer(many=True))
    @action(detail=False, methods=["get"])
    def rollups(self, request: Request) -> Response:
        """``GET /api/v1/usage/rollups``: per-minute requests, errors, tokens, latency and TTFT percentiles per
        adapter version, from the rollups (kept past the raw records' retention; about a minute behind)."""
        query = UsageRollupQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        since = data.get("since") or timezone.now() - timedelta(hours=1)
        rollups = self.within_key_adapters(UsageRollup.objects.filter(tenant=self.tenant), "adapter_version__adapter__name")
        rows = usage_rollups(rollups, since=since, until=data.get("until"),
                             model=data.get("model"))
        return Response(rows)
