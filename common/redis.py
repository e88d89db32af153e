"""The one place Quiver's Django-side processes make Redis clients (``QUIVER_GATEWAY_REDIS_URL``).

The gateway's limits, admission counters, invalidation bus, usage stream and the fleet's shared plan all talk to the
same Redis; each caller picks only its timeouts here, so the URL and the connection options cannot drift apart. The
node agent (``inference.node``) runs without Django and keeps its own client.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

_shared: redis.Redis | None = None


def redis_url() -> str:
    """``QUIVER_GATEWAY_REDIS_URL`` (empty: no Redis; callers fall back to in-process state)."""
    return str(settings.QUIVER_GATEWAY_REDIS_URL or "")


def sync_client() -> redis.Redis | None:
    """This process's shared blocking client (2 s socket and connect timeouts), or None when no URL is set.

    redis-py clients are thread-safe (a connection pool each), so one serves every thread of the process.
    """
    global _shared
    if not redis_url():
        return None
    if _shared is None:
        _shared = redis.Redis.from_url(redis_url(), socket_timeout=2, socket_connect_timeout=2)
    return _shared


def sync_client_new(*, socket_timeout: float = 5.0) -> redis.Redis:
    """A new blocking client with its own pool (for long reads such as ``XREADGROUP``).

    Raises:
        ValueError: ``QUIVER_GATEWAY_REDIS_URL`` is unset.
    """
    if not redis_url():
        raise ValueError("QUIVER_GATEWAY_REDIS_URL is unset")
    return redis.Redis.from_url(redis_url(), socket_timeout=socket_timeout, socket_connect_timeout=2)


def async_client(*, socket_timeout: float | None, connect_timeout: float = 2.0, **options: Any) -> aioredis.Redis:
    """A new asyncio client bound to the calling event loop (asyncio clients must not cross loops).

    Args:
        socket_timeout: seconds per command; None waits forever (a pub/sub reader).
        connect_timeout: seconds to connect.
        options: further ``redis.asyncio.Redis`` options, e.g. ``health_check_interval``.

    Raises:
        ValueError: ``QUIVER_GATEWAY_REDIS_URL`` is unset.
    """
    if not redis_url():
        raise ValueError("QUIVER_GATEWAY_REDIS_URL is unset")
    return aioredis.Redis.from_url(redis_url(), socket_timeout=socket_timeout,
                                  socket_connect_timeout=connect_timeout, **options)
