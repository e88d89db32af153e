"""Enqueue a Celery task once the current transaction commits, without failing the request when the broker is down.

Every task enqueued this way has a durable row that a beat job finds again (a version left ``uploaded`` is re-sent
by the validation sweeper, a ``Purge`` by the purge reconciler, a warm older than ``QUIVER_WARM_WAIT_S`` is re-sent),
so a lost enqueue only delays the work. Raising instead would answer 500 for a write that has already committed.

Services name the task (``workers.schedule``) instead of importing its module: a task module imports the services it
runs, so an import the other way would close a cycle.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Task
from django.db import transaction
from kombu.exceptions import OperationalError

from workers.celery_app import app

logger = logging.getLogger(__name__)
_IMPORT_LOCK = threading.Lock()


def task_named(name: str) -> Task:
    """The registered task called ``name`` (importing the installed apps' ``tasks`` modules on first use).

    Raises:
        KeyError: no installed app registers a task of that name.
    """
    if name not in app.tasks:
        # One importer at a time: a second thread used to find the import already started (Celery marks it done
        # first), read the registry half-filled and answer 500 NotRegistered (concurrent first uploads after a web
        # process started, scripts/fleet_scale).
        with _IMPORT_LOCK:
            if name not in app.tasks:
                app.loader.import_default_modules()
    return app.tasks[name]


def enqueue_on_commit(name: str, *args: Any) -> None:
    """``task_named(name).delay(*args)`` after commit; a broker failure (``kombu.exceptions.OperationalError``) is
    logged, not raised (see the module docstring for who picks the work up again).

    Raises:
        KeyError: at once, when no task is registered under ``name`` (a typo must not wait for the commit).
    """
    task = task_named(name)

    def send() -> None:
        try:
            task.delay(*args)
        except OperationalError as exc:
            logger.warning("task.enqueue_failed", extra={"task": name, "task_args": args, "error": str(exc)})

    transaction.on_commit(send)
