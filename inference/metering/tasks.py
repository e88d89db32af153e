"""Celery tasks of metering: the usage stream's drain, the per-minute rollups, raw-record retention (beat jobs).

Names are kept from when these tasks lived in ``inference.gateway.tasks`` (``workers.schedule``).
"""

from __future__ import annotations

import logging

import redis
from celery import shared_task

from inference.metering.rollups import usage_retention_purge, usage_rollup
from inference.metering.usage import usage_drain
from workers import schedule

logger = logging.getLogger(__name__)


@shared_task(name=schedule.USAGE_DRAIN, ignore_result=True, max_retries=0)
def usage_drain_task() -> None:
    """Beat, every second: move metered usage from the Redis stream into PostgreSQL (``usage.usage_drain``)."""
    usage_drain()


@shared_task(name=schedule.USAGE_ROLLUP, ignore_result=True, max_retries=0, time_limit=300, soft_time_limit=240)
def usage_rollup_task() -> None:
    """Beat, every minute: recompute the per-minute usage rollups of the lookback window (``rollups.usage_rollup``);
    the stream is drained first so what was metered a moment ago counts."""
    try:
        usage_drain()
    except redis.RedisError as exc:  # roll up what is stored; the next tick sees the rest
        logger.warning("usage.drain_failed", extra={"error": str(exc)})
    usage_rollup()


@shared_task(name=schedule.USAGE_RETENTION, ignore_result=True, max_retries=0, time_limit=1800, soft_time_limit=1700)
def usage_retention_task() -> None:
    """Beat, hourly: delete raw usage records past ``QUIVER_USAGE_RETENTION_DAYS`` (``rollups.usage_retention_purge``)."""
    usage_retention_purge()
