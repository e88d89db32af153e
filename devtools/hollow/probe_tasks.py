"""Celery half of the scale run's probes: each task's run time and its thread's CPU time (``<task>_cpu_ms``), by
task name, from the worker's own signals (pre- and post-run fire in the thread that runs the task).

Imported into a worker with ``celery -A config worker --include devtools.hollow.probe_tasks``; writes
``<QUIVER_HOLLOW_PROBE_DIR>/worker-<pid>.json`` (``devtools.hollow.probes.Recorder``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from devtools.hollow.probes import Recorder

_recorder = Recorder("worker")
_started: dict[str, tuple[float, float]] = {}
_lock = threading.Lock()


@task_prerun.connect
def _prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = (time.perf_counter(), time.thread_time())


@task_postrun.connect
def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    began = _started.pop(task_id or "", None)
    if began is None or task is None:
        return
    short = str(getattr(task, "name", "task")).rsplit(".", 1)[-1]
    with _lock:
        _recorder.add(f"{short}_ms", (time.perf_counter() - began[0]) * 1000)
        _recorder.add(f"{short}_cpu_ms", (time.thread_time() - began[1]) * 1000)
