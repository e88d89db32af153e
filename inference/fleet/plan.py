"""The reconcile loop's latest plan, shared through Redis so a cold request's warm goes to the version's home.

``fleet_reconcile`` computes every version's replica set (``inference.policy.placement.place``: HRW order, bounded
load by request rate, sticky to where it is held) but pre-warms only what fits the CPU slots; the rest load on their
next request. That request's warm must land where the plan put the version, or each cold version lands on whichever
node looks emptiest at that moment and every node ends up cycling through every version (what the simulator, which
routes cold requests to the plan, does not do). The plan is derived state: one Redis hash per database (so a test
run and a dev stack on one Redis do not read each other's ids) with a TTL of a few reconcile periods. Readers keep
it in-process for ``PLAN_CACHE_S`` and stop asking for ``PLAN_BACKOFF_S`` after a failure, so a slow or absent Redis
never holds up the gateway's database thread for more than one socket timeout; a missing plan falls back to the
least-resident node. Past ``PLAN_CACHE_S`` a reader first asks for the plan's digest (``GEN_FIELD``, a field of the
same hash, so it is replaced and expires with it) and reads the whole plan only when the digest moved: a plan of
2,000 versions cost every gateway process ~4.4 ms of CPU to read and parse every 2 s, and a pass that changes
nothing publishes the same digest.

The reconciler's warm backoff per (version, node) (``inference.policy.backoff``) is kept the same way, in a second
hash (:func:`warm_backoff_load`, :func:`warm_backoff_save`), so a pass on any worker sees the last pass's; without
Redis, or while it is away, this process's own copy stands in.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis
from django.conf import settings

from common.redis import sync_client
from inference.policy.backoff import WarmBackoff

logger = logging.getLogger(__name__)
PLAN_TTL_S = 120  # four 30 s reconcile periods
PLAN_CACHE_S = 2.0
PLAN_BACKOFF_S = 10.0
GEN_FIELD = "gen"  # not a version id: readers skip it as they skip any field that is not one
_lock = threading.Lock()
_cached: tuple[float, dict[int, tuple[str, ...]]] = (float("-inf"), {})
_cached_gen: str | None = None  # the digest of the plan in _cached; None: no plan was there
_down_until = float("-inf")
BACKOFF_TTL_S = 3600  # four times the longest backoff: a pair no pass visits for that long starts over
_backoff_local: dict[tuple[int, str], WarmBackoff] = {}


def plan_key() -> str:
    """The Redis key of this database's plan."""
    return f"quiver:fleet:plan:{settings.DATABASES['default'].get('NAME', '')}"


def _digest(fields: Mapping[str, str]) -> str:
    """The plan's digest: the same for the same homes in any order."""
    text = "\n".join(f"{k}={fields[k]}" for k in sorted(fields))
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def plan_publish(plans: Mapping[int, tuple[str, ...]]) -> None:
    """Replace the shared plan with ``plans`` (``{version_id: (node name, …)}``, preferred first). Never raises."""
    global _cached, _cached_gen
    client = sync_client()
    if client is None:
        return
    fields = {str(v): ",".join(names) for v, names in plans.items()}
    gen = _digest(fields) if fields else None
    try:
        pipe = client.pipeline(transaction=True)
        pipe.delete(plan_key())
        if gen is not None:
            stored: dict[Any, Any] = {**fields, GEN_FIELD: gen}  # redis-py's mapping type is invariant
            pipe.hset(plan_key(), mapping=stored)
            pipe.expire(plan_key(), PLAN_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("fleet.plan_publish_failed", extra={"error": str(exc)})
        return
    with _lock:
        _cached, _cached_gen = (time.monotonic(), {int(v): tuple(n) for v, n in plans.items()}), gen


def plan_all() -> dict[int, tuple[str, ...]]:
    """The last plan, ``{version_id: (node name, …)}``, at most ``PLAN_CACHE_S`` old; ``{}`` when there is none or
    Redis is away (then not asked again for ``PLAN_BACKOFF_S``). Never raises."""
    global _cached, _cached_gen, _down_until
    now = time.monotonic()
    with _lock:
        if now - _cached[0] < PLAN_CACHE_S:
            return _cached[1]
        if now < _down_until:
            return {}
        known, gen = _cached[1], _cached_gen
    client = sync_client()
    if client is None:
        return {}
    try:
        seen = client.hget(plan_key(), GEN_FIELD)
        if (seen.decode() if isinstance(seen, bytes) else seen) == gen:
            with _lock:
                if _cached_gen == gen:
                    _cached = (time.monotonic(), known)
            return known
        raw = client.hgetall(plan_key())
    except redis.RedisError as exc:
        logger.warning("fleet.plan_read_failed", extra={"error": str(exc)})
        with _lock:
            _down_until = time.monotonic() + PLAN_BACKOFF_S
        return {}
    out: dict[int, tuple[str, ...]] = {}
    read_gen = None
    for key, value in raw.items():
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            version_id = int(key)
        except ValueError:
            if (key.decode() if isinstance(key, bytes) else key) == GEN_FIELD:
                read_gen = text
            continue
        out[version_id] = tuple(n for n in text.split(",") if n)
    with _lock:
        _cached, _cached_gen = (time.monotonic(), out), read_gen
    return out


def plan_homes(version_id: int) -> list[str]:
    """The node names the last plan gave ``version_id``, preferred first; ``[]`` when unknown. Never raises."""
    return list(plan_all().get(version_id, ()))


def backoff_key() -> str:
    """The Redis key of this database's warm backoff states."""
    return f"quiver:fleet:warm_backoff:{settings.DATABASES['default'].get('NAME', '')}"


def warm_backoff_load() -> dict[tuple[int, str], WarmBackoff]:
    """The last pass's backoff states, ``{(version_id, node name): WarmBackoff}``; this process's copy when Redis is
    unset or away. Never raises."""
    client = sync_client()
    if client is None:
        return dict(_backoff_local)
    try:
        raw = client.hgetall(backoff_key())
    except redis.RedisError as exc:
        logger.warning("fleet.backoff_read_failed", extra={"error": str(exc)})
        return dict(_backoff_local)
    out: dict[tuple[int, str], WarmBackoff] = {}
    for field, value in raw.items():
        try:
            version, _, node = (field.decode() if isinstance(field, bytes) else str(field)).partition(":")
            failures, _, asked_at = (value.decode() if isinstance(value, bytes) else str(value)).partition(",")
            out[int(version), node] = WarmBackoff(failures=int(failures), asked_at=float(asked_at))
        except ValueError:
            continue
    return out


def warm_backoff_save(states: Mapping[tuple[int, str], WarmBackoff]) -> None:
    """Replace the shared backoff states with ``states`` (the pairs this pass visited). Never raises."""
    global _backoff_local
    _backoff_local = dict(states)
    client = sync_client()
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=True)
        pipe.delete(backoff_key())
        if states:
            pipe.hset(backoff_key(), mapping={f"{v}:{node}": f"{s.failures},{s.asked_at}"
                                              for (v, node), s in states.items()})
            pipe.expire(backoff_key(), BACKOFF_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("fleet.backoff_save_failed", extra={"error": str(exc)})
