"""Celery half of the scale run's probes: each task's run time and its thread's CPU time (``<task>_cpu_ms``), by
task name, from the worker's own signals (pre- and post-run fire in the thread that runs the task).

Imported into a worker with ``celery -A config worker --include devtools.hollow.probe_tasks``; writes
``<QUIVER_HOLLOW_PROBE_DIR>/worker-<pid>.json`` (``devtools.hollow.probes.Recorder``). With
``QUIVER_HOLLOW_PROFILE_TASKS`` set to task short names (``fleet_reconcile_task,placement_evict_task``), each run of
those is also profiled (cProfile, in the thread that runs it) into ``<dir>/profile-<task>-<pid>-<n>.pstats``.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import threading
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from devtools.hollow.probes import PROBE_DIR, Recorder

_recorder = Recorder("worker")
_started: dict[str, tuple[float, float]] = {}
_lock = threading.Lock()
_PROFILED = frozenset(filter(None, os.environ.get("QUIVER_HOLLOW_PROFILE_TASKS", "").split(",")))
_profiles: dict[str, cProfile.Profile] = {}
_numbers = itertools.count()


def _short(task: Any) -> str:
    return str(getattr(task, "name", "task")).rsplit(".", 1)[-1]


@task_prerun.connect
def _prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = (time.perf_counter(), time.thread_time())
        if task is not None and _short(task) in _PROFILED:
            profile = _profiles[task_id] = cProfile.Profile()
            profile.enable()


@task_postrun.connect
def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    began = _started.pop(task_id or "", None)
    profile = _profiles.pop(task_id or "", None)
    if profile is not None:
        profile.disable()
        profile.dump_stats(PROBE_DIR / f"profile-{_short(task)}-{os.getpid()}-{next(_numbers)}.pstats")
    if began is None or task is None:
        return
    short = _short(task)
    with _lock:
        _recorder.add(f"{short}_ms", (time.perf_counter() - began[0]) * 1000)
        _recorder.add(f"{short}_cpu_ms", (time.thread_time() - began[1]) * 1000)
        # When it began (wall clock, s): the scale run's simulator re-plans at the live reconciler's pass times.
        _recorder.add(f"{short}_at", time.time() - (time.perf_counter() - began[0]))
