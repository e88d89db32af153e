"""Timing probes around the real control plane's processes, for ``scripts/fleet_scale`` (a development tool).

- ``gateway_application``: ``config.asgi.application`` with ``inference.gateway.fleet_reader.FleetReader.load`` timed
  (wall and this thread's CPU per refresh) and, after each refresh, the propagation marker checked: the scale run writes
  ``marker.json`` (``{"id", "version_id", "node_id", "t0"}``: an operator evicted that version from that node at
  Unix time ``t0``); the first refresh whose view no longer routes the version to the node records ``now − t0``.
- ``internal_application``: ``config.internal_asgi.application`` with each ``POST /internal/v1/nodes/heartbeat``
  timed from its first byte in to its last byte out (the time to accept one heartbeat), and the CPU its view's
  thread spent (``heartbeat_cpu_ms``: on a machine shared with other work the wall time is mostly waiting), the wall
  time of its queries (``heartbeat_db_ms``) and the time from its first byte to the view's start
  (``heartbeat_wait_ms``).

Each writes ``<QUIVER_HOLLOW_PROBE_DIR>/<kind>-<pid>.json`` at most every 2 s. The Celery half is
``devtools.hollow.probe_tasks``.
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from pathlib import Path
from typing import Any

_arrived: contextvars.ContextVar[float | None] = contextvars.ContextVar("heartbeat_arrived", default=None)
PROBE_DIR = Path(os.environ.get("QUIVER_HOLLOW_PROBE_DIR", "/tmp/quiver-hollow-probes"))  # noqa: S108
DUMP_EVERY_S = 2.0


class Recorder:
    """Samples kept in memory and dumped to ``<PROBE_DIR>/<kind>-<pid>.json`` now and then."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.samples: dict[str, list[float]] = {}
        self.totals: dict[str, float] = {"started": time.time()}
        self._dumped = 0.0

    @property
    def path(self) -> Path:
        """This process's file: read at each dump, so a prefork worker's children (made after the import) each
        write their own rather than the parent's."""
        return PROBE_DIR / f"{self.kind}-{os.getpid()}.json"

    def add(self, key: str, value: float) -> None:
        """Record one sample of ``key``."""
        self.samples.setdefault(key, []).append(value)
        self.maybe_dump()

    def maybe_dump(self, force: bool = False) -> None:
        """Write the file if ``DUMP_EVERY_S`` passed since the last write."""
        now = time.monotonic()
        if not force and now - self._dumped < DUMP_EVERY_S:
            return
        self._dumped = now
        PROBE_DIR.mkdir(parents=True, exist_ok=True)
        path = self.path
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"totals": {**self.totals, "at": time.time()},
                                   "samples": {k: v[-50_000:] for k, v in self.samples.items()}}))
        tmp.replace(path)


def _marker() -> dict[str, Any] | None:
    try:
        return json.loads((PROBE_DIR / "marker.json").read_text())
    except (OSError, ValueError):
        return None


def _pooled() -> None:
    """Turn on the PostgreSQL pool as ``config.asgi`` and ``config.internal_asgi`` do before their settings load: set
    up here first, Django's settings are already loaded when those modules look, so without this each request of
    the measured process opened a PostgreSQL connection (a heartbeat's connect was 8 % of the listener's CPU in
    py-spy, and each one forks a PostgreSQL backend on the same cores)."""
    os.environ.setdefault("QUIVER_DB_POOL", "true")


def _gateway() -> Any:
    import django

    _pooled()
    django.setup()
    from inference.gateway.fleet_reader import FleetReader

    recorder = Recorder("gateway")
    original = FleetReader.load
    seen: set[Any] = set()

    def timed_load(reader: FleetReader) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        view = original(reader)
        cpu_ms = (time.thread_time() - cpu) * 1000
        recorder.totals["fleet_cpu_ms"] = recorder.totals.get("fleet_cpu_ms", 0.0) + cpu_ms
        recorder.totals["fleet_refreshes"] = recorder.totals.get("fleet_refreshes", 0.0) + 1
        marker = _marker()
        if marker and marker["id"] not in seen and not view.serves(marker["node_id"], marker["version_id"]):
            seen.add(marker["id"])
            recorder.add("propagation_ms", (time.time() - marker["t0"]) * 1000)
        recorder.add("fleet_view_ms", (time.perf_counter() - wall) * 1000)
        recorder.add("fleet_view_cpu_ms", cpu_ms)
        return view

    FleetReader.load = timed_load  # type: ignore[method-assign,assignment]
    from config.asgi import application

    return application


def _internal() -> Any:
    import functools

    import django

    _pooled()
    django.setup()
    from django.db import connection

    from inference.fleet import internal_views

    recorder = Recorder("internal")
    view = internal_views.heartbeat

    @functools.wraps(view)
    def timed_view(request: Any) -> Any:
        cpu, began = time.thread_time(), time.perf_counter()
        arrived = _arrived.get()
        if arrived is not None:  # first byte in → the view's start: body, middleware, the hop to a sync thread
            recorder.add("heartbeat_wait_ms", (began - arrived) * 1000)
        db = [0.0]

        def timed_query(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
            start = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                db[0] += time.perf_counter() - start

        try:
            with connection.execute_wrapper(timed_query):
                return view(request)
        finally:
            recorder.add("heartbeat_cpu_ms", (time.thread_time() - cpu) * 1000)
            recorder.add("heartbeat_db_ms", db[0] * 1000)  # wall time in queries: PostgreSQL's work and waits

    internal_views.heartbeat = timed_view  # before the URLconf is imported (first request)
    from config.internal_asgi import application as inner

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/nodes/heartbeat"):
            await inner(scope, receive, send)
            return
        started = time.perf_counter()
        token = _arrived.set(started)  # copied into the sync thread's context with the request
        try:
            await inner(scope, receive, send)
        finally:
            _arrived.reset(token)
            recorder.add("heartbeat_ms", (time.perf_counter() - started) * 1000)

    return timed


def __getattr__(name: str) -> Any:
    """Build the wrapped application named (``gateway_application`` / ``internal_application``) on first use."""
    if name == "gateway_application":
        app = _gateway()
    elif name == "internal_application":
        app = _internal()
    else:
        raise AttributeError(name)
    globals()[name] = app
    return app
