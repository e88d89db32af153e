"""Start the backing services the environment does not already provide, run a command, tear them down.

Usage::

    python -m devtools.services run -- pytest -q
    python -m devtools.services run -- python manage.py runserver

Each service is skipped when its env var is already set, so CI or a developer can point at real servers:

========== ====================================================================================
service    skipped when set (and exported to the child when we start it)
========== ====================================================================================
PostgreSQL ``DATABASE_URL``
Redis      ``REDIS_URL`` (``CELERY_BROKER_URL`` is exported as the same URL unless already set)
SeaweedFS  ``AWS_S3_ENDPOINT_URL`` (with ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
           ``AWS_STORAGE_BUCKET_NAME``; nodes get no S3 credential, only presigned GETs with each load)
========== ====================================================================================

Everything lives on private loopback ports with its data under one temp folder, is stopped by PID, and the
folder is removed afterwards. Every flag is explained in docs/services.md.
The demo uses :func:`start_seaweedfs` alone (re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

from devtools.postgres import PostgresService, start_postgres
from devtools.proc import ServiceStartError
from devtools.redis_server import RedisService, start_redis
from devtools.seaweedfs import S3Service, start_seaweedfs

__all__ = ["S3Service", "PostgresService", "RedisService", "ServiceStartError", "backing_services",
           "start_seaweedfs", "start_postgres", "start_redis", "main"]


@contextlib.contextmanager
def backing_services(environ: Mapping[str, str] | None = None, *, bucket: str = "quiver",
                     base_dir: Path | None = None, announce: bool = True) -> Iterator[dict[str, str]]:
    """Start whichever of PostgreSQL, Redis and SeaweedFS ``environ`` lacks; stop them all on exit.

    Args:
        environ: The environment to inspect; defaults to ``os.environ``. It is not modified.
        bucket: S3 bucket to create when SeaweedFS is started.
        base_dir: Parent for the one temp data folder (default: the system temp dir). It must be traversable
            by ``postgres`` when we are root.
        announce: Print a one-line summary of what started and how long it took (stderr).

    Yields:
        Only the env vars for the services started here (merge them over your environment).

    Raises:
        ServiceStartError: If a service cannot start; those already started are stopped first.
    """
    environ = os.environ if environ is None else environ
    root = Path(tempfile.mkdtemp(prefix="quiver-services-", dir=base_dir))
    root.chmod(0o711)  # mkdtemp makes 0700; postgres (not root) must traverse it, but needs no listing
    exported: dict[str, str] = {}
    started: list[str] = []
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            if not environ.get("DATABASE_URL"):
                pg = stack.enter_context(start_postgres(root / "postgres"))
                exported["DATABASE_URL"] = pg.url
                started.append(f"postgres :{pg.port} ({pg.started_s:.1f} s)")
            if not environ.get("REDIS_URL"):
                redis = stack.enter_context(start_redis(root / "redis"))
                exported["REDIS_URL"] = redis.url
                if not environ.get("CELERY_BROKER_URL"):
                    exported["CELERY_BROKER_URL"] = redis.url
                started.append(f"redis :{redis.port} ({redis.started_s:.1f} s)")
            if not environ.get("AWS_S3_ENDPOINT_URL"):
                s3 = stack.enter_context(start_seaweedfs(root / "s3", bucket=bucket))
                exported.update(s3.exported_env())
                started.append(f"seaweedfs {s3.endpoint_url} bucket={bucket} ({s3.started_s:.1f} s)")
            if announce:
                what = ", ".join(started) if started else "nothing (all given by env)"
                print(f"devtools.services: started {what} in {time.monotonic() - t0:.1f} s; data in {root}",
                      file=sys.stderr, flush=True)
            yield exported
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_command(command: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Start missing services, run ``command`` with their env vars, tear down, return the command's exit code.

    SIGTERM and SIGHUP are forwarded to the command. SIGINT is forwarded only when we are not in the
    terminal's foreground group: a terminal Ctrl-C already reaches the command itself, and a second SIGINT
    would make pytest abort its own teardown. Either way the services are stopped once the command exits.

    Args:
        command: argv of the command to run.
        environ: Base environment (default ``os.environ``).

    Returns:
        The command's exit code (128 + signal number if a signal killed it), or 127 if it cannot be executed.
    """
    environ = dict(os.environ if environ is None else environ)
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return  # teardown is bounded (SIGKILL after 15 s); interrupting it would leak servers
        if child is None:
            stopping = True  # still starting services: unwind once; the ExitStack stops what started
            raise KeyboardInterrupt
        if signum == signal.SIGINT and _terminal_delivers_sigint():
            return
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with backing_services(environ) as exported:
            try:
                child = subprocess.Popen(list(command), env={**environ, **exported})
            except OSError as exc:
                print(f"devtools.services: cannot run {command[0]!r}: {exc}", file=sys.stderr)
                return 127
            code = child.wait()
            stopping = True
        return 128 - code if code < 0 else code
    except KeyboardInterrupt:
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminal_delivers_sigint() -> bool:
    """True when our process group is the foreground group of a terminal (so Ctrl-C hit the child too)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: ``python -m devtools.services run -- <command ...>``.

    Returns:
        The command's exit code; 2 for a usage error; 1 if a service failed to start.
    """
    parser = argparse.ArgumentParser(prog="python -m devtools.services",
                                     description="Run a command with PostgreSQL, Redis and S3 available.")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="start missing services, run the command, tear down")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: python -m devtools.services run -- <command ...>")
    try:
        return run_command(command)
    except ServiceStartError as exc:
        print(f"devtools.services: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
