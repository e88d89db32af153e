"""``manage.py quiver_seed_usage --rows N --tenant <slug> [--days 365] [--seed 1]``: synthetic usage at scale.

Writes ``N`` :class:`~inference.metering.models.UsageRecord` rows for one existing tenant with PostgreSQL ``COPY``
(psycopg 3's ``cursor.copy()``; about 10 s of client CPU per million rows), then recomputes that tenant's
:class:`~inference.metering.models.UsageRollup` minutes and :class:`~inference.metering.models.UsageHour` sums over the
seeded period in SQL, the same figures ``rollups.usage_rollup`` computes. It exists to measure the usage pages at a year of a busy tenant's traffic
(``scripts/bench_usage``); never point it at a production database.

Shape of the rows (all seeded by ``--seed``, so two runs with the same arguments write the same values):

- ``created_at``: ``--days`` days ending at ``--until`` (default now), UTC. A day's share grows linearly by 2x over
  the period (a growing tenant), weekends carry half a weekday, and within a day the rate follows a cosine peaking at
  14:00 UTC (the trough is a fifth of the peak). Rows are written in time order (the heap's order matches arrival, as
  the gateway's writes do).
- model: the tenant's adapters (existing ones; ``--adapters`` ``seed-<i>`` adapters with ``--versions`` ready
  versions each are created on the first registered base model when the tenant has fewer adapters), Zipf-weighted,
  the newest version of each taking 80 % of its traffic and the rest shared by older versions; 10 % of requests go to
  the base model (``version_number`` null). ``api_key_id``: one of the tenant's keys, uniformly (null when none).
- ``status_code``: 96 % 200, 1 % each 400, 429 (no tokens), 499 (client left mid-answer), 502 (engine died).
- ``stream``: 60 % true, with ``ttft_ms`` log-normal (median 80 ms); null TTFT otherwise. ``prompt_tokens``
  log-normal (median 300), ``completion_tokens`` log-normal (median 120); ``latency_ms`` = TTFT + 12 ms per token
  (± 30 %), 1..5 ms for 400/429.
- ``endpoint``: 70 % ``chat/completions``, 30 % ``completions``. ``request_id``: ``seed-<8 hex of this run>-<n>``,
  unique across runs.

Idempotent-safe: a second run adds ``N`` more rows (fresh request ids) and recomputes the rollups of the minutes it
covers from every record in them, so totals stay equal to the records'. All of it is one transaction.

Prints (stderr) the rows written, the rollup rows, the seconds taken and the rate in rows/s, of the ``COPY`` alone
and of the whole run (rollups, ``ANALYZE`` and the deferred foreign-key checks at commit included).

Errors: ``CommandError`` naming the flag when ``--rows`` is missing or < 1, ``--days`` is not > 0, or ``--adapters``
or ``--versions`` is < 1; when the tenant does not exist, the database is not PostgreSQL, or adapters must be
created and no base model is registered.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.utils import timezone

from adapters_app.models import Adapter, AdapterVersion, BaseModel
from inference.metering.rollups import ADVISORY_LOCK
from tenants.models import ApiKey, Tenant

COLUMNS = ("tenant_id", "api_key_id", "adapter_version_id", "base_model_id", "model_name", "version_number",
           "endpoint", "stream", "status_code", "prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms",
           "request_id", "created_at")
CHUNK_DAYS = 7  # rows are generated and copied a week at a time (~200k rows at 10M/year): bounded memory
STATUSES = np.array([200, 400, 429, 499, 502])
STATUS_P = np.array([0.96, 0.01, 0.01, 0.01, 0.01])
BASE_SHARE = 0.10

# The rollups of [start, end) for one tenant, from every record in it (same figures as rollups._rows_postgres).
ROLLUP_SQL = """
INSERT INTO gateway_usagerollup (tenant_id, minute, model_name, version_number, adapter_version_id, requests, errors,
                                 prompt_tokens, completion_tokens, latency_p50_ms, latency_p95_ms, ttft_p50_ms,
                                 ttft_p95_ms)
SELECT tenant_id, date_trunc('minute', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', model_name, version_number,
       max(adapter_version_id), count(*), count(*) FILTER (WHERE status_code >= 400), sum(prompt_tokens),
       sum(completion_tokens), percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms)
FROM gateway_usagerecord WHERE tenant_id = %s AND created_at >= %s AND created_at < %s
GROUP BY 1, 2, 3, 4
"""
# The hourly sums of [start, end) for one tenant (as rollups._hours_replace computes them).
HOURS_SQL = """
INSERT INTO metering_usagehour (tenant_id, hour, model_name, version_number, adapter_version_id, requests, errors,
                                prompt_tokens, completion_tokens, latency_sum_ms)
SELECT tenant_id, date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', model_name, version_number,
       max(adapter_version_id), count(*), count(*) FILTER (WHERE status_code >= 400), sum(prompt_tokens),
       sum(completion_tokens), sum(latency_ms)
FROM gateway_usagerecord WHERE tenant_id = %s AND created_at >= %s AND created_at < %s
GROUP BY 1, 2, 3, 4
"""


class Command(BaseCommand):
    help = ("Seed N synthetic usage records (and their per-minute rollups) for one tenant over a period, with "
            "COPY; for measuring the usage pages at scale. Adds on every run.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--rows", type=int, default=None, help="records to add (required)")
        parser.add_argument("--tenant", required=True, help="slug of an existing tenant")
        parser.add_argument("--days", type=float, default=365.0, help="period length, days (default 365)")
        parser.add_argument("--until", default=None, help="end of the period, ISO 8601 (default now)")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--adapters", type=int, default=3, help="adapters to spread over (created if missing)")
        parser.add_argument("--versions", type=int, default=2, help="versions per created adapter")

    def handle(self, *args: Any, rows: int | None, tenant: str, days: float, until: str | None, seed: int,
               adapters: int, versions: int, **options: Any) -> None:
        if rows is None or rows < 1:
            raise CommandError("--rows N is required (N >= 1): say how many usage records to add.")
        if not days > 0:  # the period's length divides every offset: 0 has no instant to put a record at
            raise CommandError(f"--days must be more than 0 (got {days:g}).")
        if adapters < 1 or versions < 1:
            raise CommandError(f"--adapters and --versions must be 1 or more (got {adapters} and {versions}).")
        if connection.vendor != "postgresql":
            raise CommandError("quiver_seed_usage writes with PostgreSQL COPY; DATABASE_URL must be PostgreSQL.")
        owner = Tenant.objects.filter(slug=tenant).first()
        if owner is None:
            raise CommandError(f"No tenant {tenant!r}: create it first (manage.py quiver_tenant_create {tenant}).")
        end = datetime.fromisoformat(until) if until else timezone.now()
        if end.tzinfo is None:
            end = end.replace(tzinfo=UTC)
        start = end - timedelta(days=days)
        t0 = time.monotonic()
        with transaction.atomic():
            models = _models(owner, adapters, versions)
            keys: list[int | None] = [*ApiKey.objects.filter(tenant=owner).values_list("pk", flat=True)] or [None]
            written = _copy_records(owner.pk, models, keys, rows=rows, start=start, end=end, seed=seed)
            copied_s = time.monotonic() - t0
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK])  # not beside a beat rollup run
                lo = start.replace(second=0, microsecond=0)
                hi = end.replace(second=0, microsecond=0) + timedelta(minutes=1)
                cursor.execute("DELETE FROM gateway_usagerollup WHERE tenant_id = %s AND minute >= %s AND minute < %s",
                               [owner.pk, lo, hi])
                cursor.execute(ROLLUP_SQL, [owner.pk, lo, hi])
                rollups = cursor.rowcount
                lo, hi = lo.replace(minute=0), hi.replace(minute=0) + timedelta(hours=1)
                cursor.execute("DELETE FROM metering_usagehour WHERE tenant_id = %s AND hour >= %s AND hour < %s",
                               [owner.pk, lo, hi])
                cursor.execute(HOURS_SQL, [owner.pk, lo, hi])
        with connection.cursor() as cursor:  # fresh planner statistics, as autovacuum would give a live table
            cursor.execute("ANALYZE gateway_usagerecord")
            cursor.execute("ANALYZE gateway_usagerollup")
            cursor.execute("ANALYZE metering_usagehour")
        total_s = time.monotonic() - t0
        self.stderr.write(f"seeded {written} usage records for {owner.slug} over {days:g} days ending "
                          f"{end.isoformat()}; {rollups} rollup rows; {total_s:.1f} s ({written / copied_s:,.0f} "
                          f"rows/s copied, {written / total_s:,.0f} rows/s with the rollups and checks)",
                          style_func=str)


def _models(tenant: Tenant, adapters: int, versions: int) -> list[tuple[str, int | None, int | None, int | None]]:
    """``(model_name, version_number, adapter_version_id, base_model_id)`` per target; the base model last."""
    have = list(Adapter.objects.filter(tenant=tenant).order_by("pk"))
    base = BaseModel.objects.order_by("pk").first()
    if len(have) < adapters:
        if base is None:
            raise CommandError("No base model registered: register one (manage.py quiver_base_model_register) so "
                               "the seed adapters have one.")
        taken = {a.name for a in have}
        for i in range(adapters):
            name = f"seed-{i}"
            if len(have) >= adapters or name in taken:
                continue
            adapter = Adapter.objects.create(tenant=tenant, name=name, base_model=base)
            for n in range(1, versions + 1):
                AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=n, sha256=f"{n:064x}",
                                              size_bytes=1, s3_prefix=f"seed/{name}/{n}/", files=[], status="ready")
            adapter.serving_rule = [[versions, 100]]
            adapter.save(update_fields=["serving_rule"])
            have.append(adapter)
    out: list[tuple[str, int | None, int | None, int | None]] = []
    for adapter in have[:max(adapters, 1)]:
        for v in AdapterVersion.objects.filter(adapter=adapter).order_by("number"):
            out.append((adapter.name, v.number, v.pk, adapter.base_model_id))
    if base is not None:
        out.append((base.base_model_name, None, None, base.pk))
    if not out:
        raise CommandError("The tenant has no adapter versions and no base model is registered: nothing to meter.")
    return out


def _weights(models: list[tuple[str, int | None, int | None, int | None]]) -> np.ndarray:
    """Zipf over adapters (1/rank), the newest version 80 % of its adapter, the base model ``BASE_SHARE``."""
    names = list(dict.fromkeys(m[0] for m in models if m[1] is not None))
    has_base = models[-1][1] is None
    w = np.zeros(len(models))
    for i, (name, number, _, _) in enumerate(models):
        if number is None:
            continue
        mine = [m[1] for m in models if m[0] == name and m[1] is not None]
        share = 0.8 if number == max(mine) and len(mine) > 1 else 0.2 / max(len(mine) - 1, 1)
        w[i] = share / (names.index(name) + 1)
    w *= (1 - BASE_SHARE) / w.sum() if w.sum() else 0
    if has_base:
        w[-1] = BASE_SHARE if len(names) else 1.0
    return w / w.sum()


def _day_counts(rng: np.random.Generator, rows: int, start: datetime, days: float) -> np.ndarray:
    """Rows per UTC day from ``start`` (a midnight): linear 1x → 2x growth, weekends at half weight (multinomial, sums to ``rows``)."""
    n = max(1, int(np.ceil(days)))
    growth = np.linspace(1.0, 2.0, n)
    weekday = np.array([(start + timedelta(days=i)).weekday() for i in range(n)])
    w = growth * np.where(weekday >= 5, 0.5, 1.0)
    return rng.multinomial(rows, w / w.sum())


MINUTE_W = 0.6 + 0.4 * np.cos(2 * np.pi * (np.arange(1440) / 1440 - 14 / 24))  # trough/peak = 0.2/1.0
MINUTE_P = MINUTE_W / MINUTE_W.sum()


def _copy_records(tenant_id: int, models: list[tuple[str, int | None, int | None, int | None]],
                  keys: list[int | None], *, rows: int, start: datetime, end: datetime, seed: int) -> int:
    """COPY ``rows`` records into ``gateway_usagerecord`` in time order; returns how many were written."""
    rng = np.random.default_rng(seed)
    midnight = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)  # day slots are UTC days
    lead_us = int((start - midnight).total_seconds() * 1e6)
    counts = _day_counts(rng, rows, midnight, (end - midnight).total_seconds() / 86400)
    weights = _weights(models)
    run = uuid.uuid4().hex[:8]
    start_us = np.datetime64(start.astimezone(UTC).replace(tzinfo=None), "us")
    span_us = int((end - start).total_seconds() * 1e6)
    written = 0
    with connection.cursor() as django_cursor:
        cursor = django_cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with cursor.copy(f"COPY gateway_usagerecord ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for first in range(0, len(counts), CHUNK_DAYS):
                chunk = counts[first:first + CHUNK_DAYS]
                n = int(chunk.sum())
                if not n:
                    continue
                day = np.repeat(np.arange(first, first + len(chunk)), chunk)
                minute = rng.choice(1440, size=n, p=MINUTE_P)
                offset = (day * 86400 + minute * 60 + rng.random(n) * 60) * 1e6
                # From ``start``; the parts of the first and last UTC days outside the period wrap into it.
                offset = np.sort((offset.astype(np.int64) - lead_us) % span_us)
                when = np.datetime_as_string(start_us + offset.astype("timedelta64[us]"), unit="us", timezone="UTC")
                target = rng.choice(len(models), size=n, p=weights)
                key = rng.integers(0, len(keys), size=n)
                status = rng.choice(STATUSES, size=n, p=STATUS_P)
                stream = rng.random(n) < 0.6
                chat = rng.random(n) < 0.7
                refused = (status == 400) | (status == 429)
                prompt = np.where(refused, 0, np.maximum(1, rng.lognormal(np.log(300), 0.8, n))).astype(np.int64)
                completion = np.maximum(1, rng.lognormal(np.log(120), 0.9, n)).astype(np.int64)
                cut = (status == 499) | (status == 502)  # cut short: a part of what would have been generated
                completion = np.where(refused, 0, np.where(cut, completion // 3, completion))
                ttft = rng.lognormal(np.log(80), 0.5, n)
                latency = np.where(refused, 1 + 4 * rng.random(n),
                                   ttft + completion * 12 * rng.uniform(0.7, 1.3, n)).round(3)
                for i, (t, k, s, st, ch, p, c, tt, lat) in enumerate(zip(
                        target.tolist(), key.tolist(), status.tolist(), stream.tolist(), chat.tolist(),
                        prompt.tolist(), completion.tolist(), ttft.round(3).tolist(), latency.tolist(), strict=True)):
                    name, number, version_id, base_id = models[t]
                    copy.write_row((tenant_id, keys[k], version_id, base_id, name, number,
                                    "chat/completions" if ch else "completions", st, s, p, c, lat,
                                    tt if st and not (s == 400 or s == 429) else None, f"seed-{run}-{written + i}",
                                    when[i]))
                written += n
    return written
