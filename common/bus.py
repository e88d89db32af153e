"""The writer's half of the gateway's invalidation bus: Redis pub/sub on ``QUIVER_GATEWAY_BUS_CHANNEL``.

Every gateway process subscribes (``inference.gateway.bus.subscribe_forever``) and applies each ``{"kind", "id"}``
message to its caches (``inference.gateway.directory.Directory.invalidate``). Writers in any layer publish here,
after their transaction commits, so no gateway process reloads a row before it is visible. Pub/sub is
at-most-once: a lost message costs only the subscribers' TTLs and refresh intervals, never correctness.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from common.redis import sync_client

logger = logging.getLogger(__name__)


def invalidation_publish(kind: str, ident: Any = None) -> None:
    """Tell every gateway process to drop (or, for ``placements``, re-read) cached ``kind`` entries for ``ident``
    (see ``Directory.invalidate``).

    Never raises: a lost message is covered by the subscribers' flush on reconnect and the TTL fallback.
    """
    client = sync_client()
    if client is None:
        return
    try:
        client.publish(settings.QUIVER_GATEWAY_BUS_CHANNEL, json.dumps({"kind": kind, "id": ident}))
    except redis.RedisError as exc:
        logger.warning("gateway.bus_publish_failed", extra={"kind": kind, "error": str(exc)})


def invalidation_publish_on_commit(kind: str, ident: Any = None) -> None:
    """:func:`invalidation_publish` once the current transaction commits (at once outside one)."""
    transaction.on_commit(partial(invalidation_publish, kind, ident))
