"""A private PostgreSQL 15 cluster on a loopback port, for the test suite.

See docs/services.md, "PostgreSQL" (initdb 0.6 s, start 0.12 s, ~65 MB).
The server refuses to run as root, so when we are root every PostgreSQL binary runs as the ``postgres`` user.
Rather than ``su postgres -c`` we use ``Popen(user=...)``, which is the same switch of user without a
shell, and keeps the postmaster a direct child so we stop it by PID and reap it (no ``<defunct>`` left over).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devtools.proc import ServiceStartError, die_with_parent, free_port, stop_process, wait_until

PG_BIN = Path(os.environ.get("QUIVER_PG_BIN", "/usr/lib/postgresql/15/bin"))
READY_TIMEOUT_S = 30.0
_ATTEMPTS = 3
# Durability is pointless for a throwaway test cluster; these make DDL-heavy test DB creation much faster.
_FAST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


@dataclass
class PostgresService:
    """A running private cluster with role and database ``quiver`` (role has CREATEDB for pytest-django).

    Attributes:
        port: TCP port on 127.0.0.1.
        data_dir: Folder holding the cluster (``data/``), its socket and log.
        process: The postmaster child.
        started_s: Seconds from initdb to "database ready".
    """

    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    started_s: float = 0.0

    @property
    def url(self) -> str:
        """``DATABASE_URL`` for django-environ (password auth is ``trust`` on loopback anyway)."""
        return f"postgres://quiver:quiver@127.0.0.1:{self.port}/quiver"

    def stop(self) -> None:
        """Stop by PID with SIGINT, PostgreSQL's "fast" shutdown (rolls back open sessions). Idempotent."""
        stop_process(self.process, sig=signal.SIGINT)

    def restart(self, *, down_s: float = 0.0, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Restart the server as an operator would: fast shutdown (every session is terminated, clients see
        ``FATAL: terminating connection due to administrator command``), ``down_s`` seconds refusing connections,
        then start on the same port and data, waiting until it accepts connections.

        Raises:
            ServiceStartError: If it does not come back within ``timeout_s``.
        """
        self.stop()
        time.sleep(down_s)
        self.start(timeout_s=timeout_s)

    def start(self, *, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the stopped cluster again on the same port and data; returns once it accepts connections.

        Raises:
            ServiceStartError: If it does not come back within ``timeout_s``.
        """
        log_path = self.data_dir / "postgres.log"
        self.process = _postmaster(self.data_dir, _run_as(), log_path, self.port)
        _wait_ready(self.process, self.port, log_path, timeout_s)

    def __enter__(self) -> PostgresService:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _run_as() -> str | None:
    """Return ``"postgres"`` when we are root (the server refuses root), else None (run as ourselves)."""
    return "postgres" if os.geteuid() == 0 else None


def _prepare_dir(data_dir: Path, user: str | None) -> None:
    """Create ``data_dir`` and hand it to ``user``; its parents must be traversable by that user.

    Raises:
        ServiceStartError: If a parent folder is not traversable (e.g. under /root, mode 0700).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    for parent in data_dir.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise ServiceStartError(f"{parent} is not traversable by {user}; put the data dir elsewhere (e.g. /tmp)")


def _pg(args: list[str], *, user: str | None, log_path: Path) -> None:
    """Run a PostgreSQL client tool to completion as ``user``.

    Raises:
        ServiceStartError: On a non-zero exit, with the tool's output.
    """
    done = subprocess.run(args, user=user, capture_output=True, text=True, check=False, timeout=60, cwd="/")
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise ServiceStartError(f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr.strip()}")


def start_postgres(data_dir: Path, *, timeout_s: float = READY_TIMEOUT_S) -> PostgresService:
    """initdb a new cluster in ``data_dir``, start it on a free loopback port and create role/db ``quiver``.

    Args:
        data_dir: Empty or new folder; it must be traversable by ``postgres`` when we are root.
        timeout_s: Seconds to wait for the server to accept connections.

    Returns:
        The running service.

    Raises:
        ServiceStartError: If the binaries are missing, initdb fails or the server does not come up.
    """
    if not (PG_BIN / "postgres").exists():
        raise ServiceStartError(f"PostgreSQL binaries not in {PG_BIN}: apt-get install -y postgresql (or set QUIVER_PG_BIN)")
    data_dir = Path(data_dir).resolve()
    user = _run_as()
    _prepare_dir(data_dir, user)
    log_path = data_dir / "postgres.log"
    t0 = time.monotonic()
    _pg([str(PG_BIN / "initdb"), "-D", str(data_dir / "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8",
         "--locale=C.UTF-8"], user=user, log_path=log_path)
    last_error: ServiceStartError | None = None
    for _ in range(_ATTEMPTS):  # the port may be taken between picking and binding
        try:
            service = _start_once(data_dir, user, log_path, timeout_s)
        except ServiceStartError as exc:
            last_error = exc
            continue
        service.started_s = time.monotonic() - t0
        return service
    assert last_error is not None
    raise last_error


def _postmaster(data_dir: Path, user: str | None, log_path: Path, port: int) -> subprocess.Popen[bytes]:
    """Start the postmaster of the cluster in ``data_dir`` on ``port`` (returns at once)."""
    cmd = [str(PG_BIN / "postgres"), "-D", str(data_dir / "data"), "-p", str(port), "-k", str(data_dir),
           "-c", "listen_addresses=127.0.0.1"]
    for setting in _FAST_SETTINGS:
        cmd += ["-c", setting]
    with open(log_path, "ab") as log:
        return subprocess.Popen(die_with_parent(cmd, "INT"), user=user, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd="/", start_new_session=True)


def _psql(port: int) -> list[str]:
    return [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres",
            "-v", "ON_ERROR_STOP=1", "-qAt"]


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout_s: float) -> None:
    def ready() -> bool:
        return subprocess.run([*_psql(port), "-c", "SELECT 1"], capture_output=True, check=False,
                              timeout=5).returncode == 0

    wait_until(ready, timeout_s=timeout_s, what="postgres", proc=proc, log_path=log_path)


def _start_once(data_dir: Path, user: str | None, log_path: Path, timeout_s: float) -> PostgresService:
    """Start the postmaster on a fresh port, wait for it, create role and database; stop it on failure."""
    port = free_port()
    proc = _postmaster(data_dir, user, log_path, port)
    service = PostgresService(port, data_dir, proc)
    psql = _psql(port)
    try:
        _wait_ready(proc, port, log_path, timeout_s)
        # CREATEDB lets pytest-django create and drop test_quiver.
        _pg([*psql, "-c", "CREATE ROLE quiver LOGIN PASSWORD 'quiver' CREATEDB",
             "-c", "CREATE DATABASE quiver OWNER quiver"], user=None, log_path=log_path)
    except BaseException:
        service.stop()
        raise
    return service
