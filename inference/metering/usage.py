"""Usage metering: one row per proxied request, written in batches off the request path (and one, with no tokens, per
request the gateway refused for a known key, within a per-tenant budget: ``inference.gateway.usage_sink``).

The gateway emits one dict per request (:func:`usage_row`) to ``inference.gateway.usage_sink``; with Redis it lands
in the stream ``QUIVER_USAGE_STREAM`` at once and :func:`usage_drain` (Celery beat, every second; also run before the
usage API answers) moves it into PostgreSQL through a consumer group. An entry is acknowledged only after its row is
committed, entries of a dead consumer are reclaimed after ``RECLAIM_IDLE_MS``, and ``request_id`` is unique, so a
crash anywhere loses nothing and writes nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, transaction

from common.redis import sync_client_new
from inference.metering.models import UsageRecord

logger = logging.getLogger(__name__)
RECLAIM_IDLE_MS = 30_000
FIELDS = ("request_id", "tenant_id", "api_key_id", "adapter_version_id", "base_model_id", "node_id", "model_name",
          "version_number", "endpoint", "stream", "status_code", "prompt_tokens", "completion_tokens", "latency_ms",
          "ttft_ms", "created_at")
MODEL_NAME_MAX = UsageRecord._meta.get_field("model_name").max_length or 200


def usage_row(*, tenant_id: int, api_key_id: int, adapter_version_id: int | None, base_model_id: int | None,
              node_id: int | None, model_name: str, version_number: int | None, endpoint: str, stream: bool,
              status_code: int, usage: Mapping[str, Any] | None, latency_ms: float, ttft_ms: float | None,
              created_at: float) -> dict[str, Any]:
    """One usage record as plain JSON types. ``usage`` is OpenAI's ``{"prompt_tokens", "completion_tokens"}``
    (or None: nothing reached the engine); ``created_at`` is the request's arrival, Unix seconds."""
    usage = usage or {}
    return {
        "request_id": uuid.uuid4().hex, "tenant_id": tenant_id, "api_key_id": api_key_id,
        "adapter_version_id": adapter_version_id, "base_model_id": base_model_id, "node_id": node_id,
        "model_name": model_name, "version_number": version_number, "endpoint": endpoint, "stream": stream,
        "status_code": status_code, "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0), "latency_ms": round(latency_ms, 3),
        "ttft_ms": None if ttft_ms is None else round(ttft_ms, 3), "created_at": created_at,
    }


def _existing(model: Any, ids: Iterable[int | None]) -> set[int]:
    wanted = {i for i in ids if i is not None}
    return set(model.objects.filter(pk__in=wanted).values_list("pk", flat=True)) if wanted else set()


def usage_records_write(rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert usage rows (idempotent on ``request_id``: a row already written is skipped); returns how many rows
    were offered for insert.

    References to rows deleted since the request (a key, version, node) become null, as on deletion; records of a
    deleted tenant are dropped with it.
    """
    from adapters_app.models import AdapterVersion, BaseModel
    from tenants.models import ApiKey, Tenant

    node_model = UsageRecord._meta.get_field("node").related_model  # the fleet's Node, by app label: no import
    if not rows:
        return 0
    live = {
        "tenant_id": _existing(Tenant, (r["tenant_id"] for r in rows)),
        "api_key_id": _existing(ApiKey, (r["api_key_id"] for r in rows)),
        "adapter_version_id": _existing(AdapterVersion, (r["adapter_version_id"] for r in rows)),
        "base_model_id": _existing(BaseModel, (r["base_model_id"] for r in rows)),
        "node_id": _existing(node_model, (r["node_id"] for r in rows)),
    }
    objs = []
    for r in rows:
        if r["tenant_id"] not in live["tenant_id"]:
            continue
        data = {k: r.get(k) for k in FIELDS}
        for fk in ("api_key_id", "adapter_version_id", "base_model_id", "node_id"):
            if data[fk] not in live[fk]:
                data[fk] = None
        data["created_at"] = datetime.fromtimestamp(float(r["created_at"]), tz=UTC)
        # The gateway accepts a longer `model` than the column holds: one such row (a refusal's, when it named the
        # model as sent) made PostgreSQL refuse the whole batch, so every tenant's rows stayed in the stream for ever.
        data["model_name"] = str(data["model_name"] or "")[:MODEL_NAME_MAX]
        objs.append(UsageRecord(**data))
    try:
        with transaction.atomic():
            UsageRecord.objects.bulk_create(objs, ignore_conflicts=True, batch_size=500)
    except DatabaseError:
        # One row the database refuses must not hold back the others (the drain retries a failed batch whole,
        # for ever): write them one by one and drop, with a log line, only those refused.
        for obj in objs:
            try:
                with transaction.atomic():
                    UsageRecord.objects.bulk_create([obj], ignore_conflicts=True)
            except DatabaseError as exc:
                logger.error("usage.row_refused", extra={"request_id": obj.request_id, "error": repr(exc)[:300]})
    return len(objs)


def _redis() -> redis.Redis:
    return sync_client_new(socket_timeout=5)


def _consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _ensure_group(client: redis.Redis) -> None:
    try:
        client.xgroup_create(settings.QUIVER_USAGE_STREAM, settings.QUIVER_USAGE_GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _write_entries(client: redis.Redis, entries: Any) -> int:
    """Write ``[(entry_id, {b"r": json})]`` as rows, then acknowledge and delete the entries."""
    if not entries:
        return 0
    rows = []
    for _, fields in entries:
        try:
            rows.append(json.loads(fields[b"r"]))
        except (KeyError, ValueError):
            logger.error("usage.bad_entry", extra={"fields": repr(fields)[:200]})
    with transaction.atomic():
        written = usage_records_write(rows)
    ids = [entry_id for entry_id, _ in entries]
    stream, group = settings.QUIVER_USAGE_STREAM, settings.QUIVER_USAGE_GROUP
    client.xack(stream, group, *ids)
    client.xdel(stream, *ids)
    return written


def usage_drain(*, batch: int = 1000, max_batches: int = 20) -> int:
    """Move usage records from the Redis stream into PostgreSQL; returns how many rows were written.

    No-op without ``QUIVER_GATEWAY_REDIS_URL`` (the gateway then writes rows itself). Safe to run concurrently:
    each entry goes to one consumer, and a consumer that dies holding entries loses them to the next drain after
    ``RECLAIM_IDLE_MS``.

    Raises:
        redis.RedisError: Redis unreachable (Celery beat retries on the next tick).
    """
    if not settings.QUIVER_GATEWAY_REDIS_URL:
        return 0
    client = _redis()
    try:
        _ensure_group(client)
        stream, group, consumer = settings.QUIVER_USAGE_STREAM, settings.QUIVER_USAGE_GROUP, _consumer()
        _, claimed, *_ = client.xautoclaim(stream, group, consumer, min_idle_time=RECLAIM_IDLE_MS, start_id="0-0",
                                           count=batch)
        total = _write_entries(client, claimed)
        for _ in range(max_batches):
            answer: Any = client.xreadgroup(group, consumer, {stream: ">"}, count=batch)
            entries = answer[0][1] if answer else []
            if not entries:
                break
            total += _write_entries(client, entries)
        return total
    finally:
        client.close()
