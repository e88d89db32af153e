"""A private Redis on a loopback port, without persistence.

See docs/services.md, "Redis" (PONG after 0.02 s, 7 MB). Rather than ``--daemonize yes`` we keep it
in the foreground as our child, so its PID is ours to stop and reap.
(Named ``redis_server`` so it can never be mistaken for the ``redis`` client package.)
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devtools.proc import ServiceStartError, die_with_parent, free_port, stop_process, wait_until

READY_TIMEOUT_S = 15.0
_ATTEMPTS = 3


@dataclass
class RedisService:
    """A running redis-server.

    Attributes:
        port: TCP port on 127.0.0.1.
        data_dir: Folder for its log (nothing is persisted).
        process: The redis-server child.
        started_s: Seconds until it answered PING.
    """

    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    started_s: float = 0.0

    @property
    def url(self) -> str:
        """``REDIS_URL`` / ``CELERY_BROKER_URL`` (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop by PID with SIGTERM (with ``--save ""`` nothing is written). Idempotent."""
        stop_process(self.process)

    def __enter__(self) -> RedisService:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def find_redis_server() -> str:
    """Locate ``redis-server``; when missing and we are root, ``apt-get install -y redis-server`` (about 4 s).

    Raises:
        ServiceStartError: If it is missing and cannot be installed.
    """
    found = shutil.which("redis-server")
    if found is None and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=False, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
        found = shutil.which("redis-server")
    if found is None:
        raise ServiceStartError("redis-server not found: apt-get install -y redis-server")
    return found


def _ping(port: int) -> bool:
    """Send an inline PING over RESP and expect +PONG (no client library needed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


def start_redis(data_dir: Path, *, timeout_s: float = READY_TIMEOUT_S, port: int | None = None) -> RedisService:
    """Start ``redis-server`` on a free loopback port (or ``port``) with persistence off, and wait for PONG.

    Args:
        data_dir: Folder for the log and working dir (created if missing).
        timeout_s: Seconds to wait for PONG.
        port: A fixed port (a restart keeps its clients' URL); tried once.

    Returns:
        The running service.

    Raises:
        ServiceStartError: If redis-server is missing, exits, or does not answer in time.
    """
    binary = find_redis_server()
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "redis.log"
    t0 = time.monotonic()
    last_error: ServiceStartError | None = None
    fixed = port
    for _ in range(1 if fixed else _ATTEMPTS):  # a picked port may be taken between picking and binding
        port = fixed or free_port()
        cmd = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
               "--dir", str(data_dir), "--logfile", str(log_path), "--daemonize", "no"]
        proc = subprocess.Popen(die_with_parent(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        service = RedisService(port, data_dir, proc)
        try:
            wait_until(functools.partial(_ping, port), timeout_s=timeout_s, what="redis", proc=proc, log_path=log_path)
        except ServiceStartError as exc:
            service.stop()
            last_error = exc
            continue
        except BaseException:
            service.stop()
            raise
        service.started_s = time.monotonic() - t0
        return service
    assert last_error is not None
    raise last_error
