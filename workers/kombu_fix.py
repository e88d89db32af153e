"""Guards for crashes of Celery 5.7.0 workers when the Redis broker goes away with tasks in hand.

Celery 5.7.0 closes the broken broker connection at once (``Consumer.on_connection_error_after_connected``). Two
paths then reach a channel whose transport client is already gone (``channel.connection`` is None) and raise
``AttributeError`` (``'NoneType' object has no attribute 'hostname'`` / ``'client'``), which ``ignore_errors`` and
``Message.ack_log_error`` do not catch, so the worker stops ("Unrecoverable error") and serves nothing until
something restarts it. Both seen in ``tests/faults/test_redis_restarted.py``:

- closing the channel restores its unacknowledged messages (``kombu.transport.redis.QoS.restore_unacked``);
- a late-acked task that finished while the broker was away is acked (or rejected) after the reconnect, on its old
  closed channel (``QoS.ack`` / ``QoS.reject``, from ``Message.ack_log_error``).

And one for the demo's serverless broker (kombu 5.7.0's ``filesystem`` transport): ``Channel._put`` creates the
message file, then locks and writes it, while a consumer's ``_get`` renames any ``*.msg`` file it lists (a rename
ignores the writer's advisory lock) and reads it; a file taken between creation and write is read empty, and the
``JSONDecodeError`` stops the worker for good ("Unrecoverable error", seen 4.5 minutes into a kept-up demo while the
web process queued a usage drain every second). ``_put`` now writes a hidden temp name no consumer lists, then renames
it into place, so a message file is whole from the moment it is visible.

Skipping either Redis call loses nothing: the messages stay in Redis's unacked index, from which kombu puts them
back after the visibility timeout (``restore_visible``); a rerun is a no-op because every task guards on its status
row; and if Redis lost them too the beat sweeper re-sends every version left ``uploaded``. Remove this when a kombu
release fixes the close path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem as kombu_filesystem
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import base as kombu_virtual

logger = logging.getLogger(__name__)
_restore_unacked = kombu_redis.QoS.restore_unacked
_ack = kombu_redis.QoS.ack
_reject = kombu_redis.QoS.reject
_put_original = kombu_filesystem.Channel._put


def _closed(qos: Any) -> bool:
    return getattr(qos.channel, "connection", None) is None or getattr(qos.channel.connection, "client", None) is None


def _restore_unacked_or_leave(self: Any, client: Any = None) -> Any:
    try:
        return _restore_unacked(self, client)
    except AttributeError:
        logger.warning("celery.restore_unacked_skipped",
                       extra={"event": "celery.restore_unacked_skipped", "messages": len(self._delivered)})
        return None


def _settle_or_forget(original: Any, event: str) -> Any:
    def settle(self: Any, delivery_tag: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, delivery_tag, *args, **kwargs)
        except AttributeError:
            if not _closed(self):
                raise
            logger.warning(event, extra={"event": event, "delivery_tag": str(delivery_tag)})
            kombu_virtual.QoS.ack(self, delivery_tag)  # forget it here; Redis keeps it for restore_visible
            return None
    settle.__name__ = f"{original.__name__}_or_forget"
    settle.__wrapped__ = original  # type: ignore[attr-defined]
    return settle


_ack_or_forget = _settle_or_forget(_ack, "celery.ack_on_closed_channel_skipped")
_reject_or_forget = _settle_or_forget(_reject, "celery.reject_on_closed_channel_skipped")


def _put_whole(self: Any, queue: str, payload: Any, **kwargs: Any) -> None:
    """kombu's ``filesystem`` ``Channel._put`` (same file name, same content), written under a name starting with
    ``.`` (its ``_get`` takes only ``<stamp>_<uuid>.<queue>.msg``) and renamed into place once complete.

    Raises:
        kombu.exceptions.ChannelError: the folder cannot be written.
    """
    name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
    final = os.path.join(self.data_folder_out, name)
    partial = os.path.join(self.data_folder_out, "." + name + ".part")
    try:
        with open(partial, "wb") as handle:
            handle.write(kombu_filesystem.str_to_bytes(kombu_filesystem.dumps(payload)))
        os.replace(partial, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise kombu_filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


def install() -> None:
    """Wrap ``QoS.restore_unacked``, ``QoS.ack`` and ``QoS.reject`` of kombu's Redis transport, and make the
    ``filesystem`` transport's ``Channel._put`` atomic (idempotent). Raises nothing; an ``AttributeError`` on a channel
    that is still open is re-raised by the wrappers."""
    if kombu_filesystem.Channel._put is not _put_whole:
        kombu_filesystem.Channel._put = _put_whole  # type: ignore[method-assign]
    if kombu_redis.QoS.restore_unacked is not _restore_unacked_or_leave:
        kombu_redis.QoS.restore_unacked = _restore_unacked_or_leave  # type: ignore[method-assign]
    if kombu_redis.QoS.ack is not _ack_or_forget:
        kombu_redis.QoS.ack = _ack_or_forget  # type: ignore[method-assign]
    if kombu_redis.QoS.reject is not _reject_or_forget:
        kombu_redis.QoS.reject = _reject_or_forget  # type: ignore[method-assign]
