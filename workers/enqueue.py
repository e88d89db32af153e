"""Enqueue a Celery task once the current transaction commits, without failing the request when the broker is down.

Every task enqueued this way has a durable row that a beat job finds again (a version left ``uploaded`` is re-sent
by the validation sweeper, a ``Purge`` by the purge reconciler, a warm older than ``QUIVER_WARM_WAIT_S`` is re-sent),
so a lost enqueue only delays the work. Raising instead would answer 500 for a write that has already committed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)


def enqueue_on_commit(task: Any, *args: Any) -> None:
    """``task.delay(*args)`` after commit; a broker failure (``kombu.exceptions.OperationalError``) is logged, not
    raised (see the module docstring for who picks the work up again)."""

    def send() -> None:
        try:
            task.delay(*args)
        except OperationalError as exc:
            logger.warning("task.enqueue_failed", extra={"task": getattr(task, "name", str(task)), "task_args": args,
                                                         "error": str(exc)})

    transaction.on_commit(send)
