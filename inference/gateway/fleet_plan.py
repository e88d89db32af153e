"""The reconcile loop's latest plan, shared through Redis so a cold request's warm goes to the version's home.

``fleet_reconcile`` computes every version's replica set (``inference.fleet.placement.place``: HRW order, bounded
load by request rate, sticky to where it is held) but pre-warms only what fits the CPU slots; the rest load on their
next request. That request's warm must land where the plan put the version, or each cold version lands on whichever
node looks emptiest at that moment and every node ends up cycling through every version (what the simulator, which
routes cold requests to the plan, does not do). The plan is derived state: it lives in one Redis hash with a TTL of
a few reconcile periods, and a missing or unreachable plan falls back to the least-resident node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from inference.gateway.bus import sync_client

logger = logging.getLogger(__name__)
PLAN_KEY = "quiver:fleet:plan"
PLAN_TTL_S = 120  # four 30 s reconcile periods


def plan_publish(plans: Mapping[int, tuple[str, ...]]) -> None:
    """Replace the shared plan with ``plans`` (``{version_id: (node name, …)}``, preferred first). Never raises."""
    client = sync_client()
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=True)
        pipe.delete(PLAN_KEY)
        if plans:
            pipe.hset(PLAN_KEY, mapping={str(v): ",".join(names) for v, names in plans.items()})
            pipe.expire(PLAN_KEY, PLAN_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("fleet.plan_publish_failed", extra={"error": str(exc)})


def plan_homes(version_id: int) -> list[str]:
    """The node names the last plan gave ``version_id``, preferred first; ``[]`` when unknown. Never raises."""
    client = sync_client()
    if client is None:
        return []
    try:
        raw = client.hget(PLAN_KEY, str(version_id))
    except redis.RedisError as exc:
        logger.warning("fleet.plan_read_failed", extra={"error": str(exc)})
        return []
    if not raw:
        return []
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [name for name in text.split(",") if name]


def plan_all() -> dict[int, tuple[str, ...]]:
    """The whole last plan, ``{version_id: (node name, …)}``; ``{}`` when none or Redis is away. Never raises."""
    client = sync_client()
    if client is None:
        return {}
    try:
        raw = client.hgetall(PLAN_KEY)
    except redis.RedisError as exc:
        logger.warning("fleet.plan_read_failed", extra={"error": str(exc)})
        return {}
    out: dict[int, tuple[str, ...]] = {}
    for key, value in raw.items():
        try:
            version_id = int(key)
        except ValueError:
            continue
        out[version_id] = tuple(n for n in (value.decode() if isinstance(value, bytes) else str(value)).split(",") if n)
    return out
