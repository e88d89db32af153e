"""Cache invalidation across gateway processes: Redis pub/sub on ``QUIVER_GATEWAY_BUS_CHANNEL``.

Writers publish ``{"kind", "id"}`` after their transaction commits (``common.bus``: the signal receivers in
``inference.gateway.signals``, and the fleet when a placement stops serving); every gateway process subscribes and
applies each message to its caches (``Directory.invalidate``). Pub/sub
is at-most-once, so a (re)subscription flushes every cache, and while the subscription is down the caches fall back
to TTLs of ``QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S``: a revoked key stops within about a second either way.
"""

from __future__ import annotations

import asyncio
import json
import logging

from django.conf import settings

from common.redis import async_client
from inference.gateway.directory import Directory

logger = logging.getLogger(__name__)
# Seconds between liveness pings on an idle subscription (and redis-py's health check interval).
PING_S = 5.0


async def subscribe_forever(directory: Directory) -> None:
    """Apply invalidations to ``directory`` until cancelled; reconnects every second while Redis is away."""
    url = settings.QUIVER_GATEWAY_REDIS_URL
    if not url:
        return
    while True:
        client = async_client(socket_timeout=None, health_check_interval=PING_S)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(settings.QUIVER_GATEWAY_BUS_CHANNEL)
            directory.invalidate("all")  # messages may have been missed while unsubscribed
            directory.bus_ok = True
            while True:
                message = await pubsub.get_message(timeout=PING_S)
                if message is None:
                    await pubsub.ping()
                    continue
                if message.get("type") != "message":
                    # Replies to the pings above and to redis-py's health checks arrive here as "pong" messages.
                    # Read as malformed invalidations they flushed every cache of every gateway process each 5 s,
                    # and the reloads through the one database thread stalled requests by up to 0.4 s
                    # (scripts/bench_fairness, 2026-12-05).
                    continue
                try:
                    data = json.loads(message["data"])
                    directory.invalidate(str(data["kind"]), data.get("id"))
                except (ValueError, KeyError, TypeError):
                    directory.invalidate("all")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any Redis or socket failure: fall back to short TTLs and retry
            if directory.bus_ok:
                logger.warning("gateway.bus_lost", extra={"error": repr(exc)})
            directory.bus_ok = False
            await asyncio.sleep(1.0)
        finally:
            directory.bus_ok = False
            try:
                await pubsub.aclose()
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass
