"""A guard for a crash of Celery 5.7.0 workers when the Redis broker goes away with tasks in hand.

Celery 5.7.0 closes the broken broker connection at once (``Consumer.on_connection_error_after_connected``); closing
the channel restores its unacknowledged messages (``kombu.transport.redis.QoS.restore_unacked``), which rebuilds a
connection pool from a transport whose client is already gone and raises ``AttributeError: 'NoneType' object has
no attribute 'hostname'``. ``ignore_errors`` does not catch that, so the worker stops ("Unrecoverable error") and
serves nothing until something restarts it. Seen in ``tests/faults/test_redis_restarted.py``.

Skipping the restore loses nothing: the messages stay in Redis's unacked index, from which kombu puts them back
after the visibility timeout (``restore_visible``), and if Redis lost them too the beat sweeper re-sends every
version left ``uploaded``. Remove this when a kombu release fixes the close path.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis

logger = logging.getLogger(__name__)
_restore_unacked = kombu_redis.QoS.restore_unacked


def _restore_unacked_or_leave(self: Any, client: Any = None) -> Any:
    try:
        return _restore_unacked(self, client)
    except AttributeError:
        logger.warning("celery.restore_unacked_skipped",
                       extra={"event": "celery.restore_unacked_skipped", "messages": len(self._delivered)})
        return None


def install() -> None:
    """Wrap ``QoS.restore_unacked`` of kombu's Redis transport (idempotent). Raises nothing."""
    if kombu_redis.QoS.restore_unacked is not _restore_unacked_or_leave:
        kombu_redis.QoS.restore_unacked = _restore_unacked_or_leave  # type: ignore[method-assign]
