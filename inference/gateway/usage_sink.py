"""Where the gateway puts usage records: off the request path, in batches.

``emit`` only appends to an in-process buffer; a background task flushes it ``BATCH_WINDOW_S`` after the first
record of a batch arrives, with one pipelined ``XADD`` per batch to ``QUIVER_USAGE_STREAM``, from where
``metering.usage_drain`` writes PostgreSQL. Flushing each record at once cost one Redis round trip per request,
about a fifth of the gateway's CPU per 1-token completion (py-spy under ``scripts/bench_gateway``). A graceful stop
flushes (lifespan shutdown); a process killed outright loses at most one window of records. Without Redis (the
SQLite demo) the task inserts the rows itself. While the target is down the buffer is kept (bounded by
``MAX_BUFFER``) and retried every second.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings

from common.redis import async_client
from inference.gateway.directory import db_call
from inference.metering.usage import usage_records_write

logger = logging.getLogger(__name__)
MAX_BUFFER = 100_000
BATCH_WINDOW_S = 0.1
# Rows for requests the gateway refused itself (400, 404, 429, 503...), per tenant and process: a client hammering
# past its limit must not turn each refusal into a database row. Past the budget they are only counted.
REFUSAL_ROWS_PER_S = 5.0
REFUSAL_ROWS_BURST = 100.0


class UsageSink:
    """The process's usage buffer; :meth:`run_forever` is its flusher task."""

    def __init__(self) -> None:
        self._buffer: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._redis: aioredis.Redis | None = None
        self._refusal_budget: dict[int, tuple[float, float]] = {}  # tenant id -> (rows left, monotonic time)
        self.refusals_unrecorded = 0

    def emit(self, row: dict[str, Any]) -> None:
        """Queue one record (``metering.usage_row``); never blocks or raises."""
        if len(self._buffer) >= MAX_BUFFER:
            dropped = self._buffer.popleft()
            logger.error("usage.buffer_full", extra={"request_id": dropped.get("request_id")})
        self._buffer.append(row)
        self._idle.clear()
        self._wake.set()

    def emit_refusal(self, row: dict[str, Any], now: float) -> bool:
        """Queue the row of a request the gateway refused itself, within its tenant's budget
        (:data:`REFUSAL_ROWS_PER_S`, bursts of :data:`REFUSAL_ROWS_BURST`; ``now``: monotonic seconds); past it the
        refusal is only counted in ``refusals_unrecorded``. Returns whether the row was queued."""
        tenant = int(row["tenant_id"])
        left, at = self._refusal_budget.get(tenant, (REFUSAL_ROWS_BURST, now))
        left = min(REFUSAL_ROWS_BURST, left + (now - at) * REFUSAL_ROWS_PER_S)
        if left < 1.0:
            self._refusal_budget[tenant] = (left, now)
            self.refusals_unrecorded += 1
            return False
        if len(self._refusal_budget) >= MAX_BUFFER:
            self._refusal_budget.clear()
        self._refusal_budget[tenant] = (left - 1.0, now)
        self.emit(row)
        return True

    async def flushed(self, timeout: float = 5.0) -> bool:
        """Wait until every emitted record has been handed on; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        url = settings.QUIVER_GATEWAY_REDIS_URL
        if not url:
            await db_call(usage_records_write, rows)
            return
        if self._redis is None:
            self._redis = async_client(socket_timeout=5)
        pipe = self._redis.pipeline(transaction=False)
        for row in rows:
            pipe.xadd(settings.QUIVER_USAGE_STREAM, {"r": json.dumps(row, separators=(",", ":"))})
        await pipe.execute()

    async def run_forever(self) -> None:
        """Flush the buffer whenever records arrive, until cancelled."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(BATCH_WINDOW_S)
            self._wake.clear()
            while self._buffer:
                rows = list(self._buffer)
                try:
                    await self._write(rows)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Redis or the database away: keep the rows, retry
                    logger.warning("usage.flush_failed", extra={"rows": len(rows), "error": repr(exc)})
                    self._redis = None
                    await asyncio.sleep(1.0)
                    continue
                for _ in rows:
                    self._buffer.popleft()
            self._idle.set()
