"""Process and port helpers shared by the service launchers.

Every service runs as a direct child of this Python process (never daemonized), so we hold its PID,
can stop it by PID and reap it: no ``<defunct>`` orphans, no pid files to trust.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

# SeaweedFS serves gRPC on every HTTP port + 10000 (notes/services.md), so its HTTP ports must leave room for that.
GRPC_OFFSET = 10_000
_LOW, _HIGH = 20_000, 45_000  # below the usual ephemeral range (32768+ on Linux is fine here: +10000 stays < 65536)


class ServiceStartError(RuntimeError):
    """A backing service did not become ready; the message carries the tail of its log."""


def die_with_parent(cmd: Sequence[str], signame: str = "TERM") -> list[str]:
    """``cmd`` prefixed so that Linux sends it ``SIG<signame>`` when this process dies (``setpriv --pdeathsig``,
    util-linux; ``prctl(PR_SET_PDEATHSIG)`` survives the ``exec``).

    The services run in sessions of their own (a terminal's Ctrl-C must reach the command under test first), so a
    SIGKILL to the demo's or the tests' process group did not reach them: PostgreSQL, Redis and SeaweedFS kept their
    ports and data folders until stopped by hand. The signal is tied to the thread that started the child: start
    services from one that lives as long as they do (the main thread here). Returns ``cmd`` unchanged where
    ``setpriv`` is missing (not Linux)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", signame, "--", *cmd] if setpriv else list(cmd)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Say whether ``host:port`` can be bound right now.

    Args:
        port: TCP port number.
        host: Address to test; services bind loopback only.

    Returns:
        True when a listening socket could be bound (it is closed again at once).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that the kernel reports as free.

    There is a window between this call and the service binding it; launchers retry on a clash.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_outside_ephemeral(taken: set[int] | None = None) -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), not in
    ``taken`` (which it joins): a port picked now and bound later, as ``fleet_scale`` registers 128 node ports before
    starting their servers, cannot meanwhile become the local port of an outgoing connection, which an ephemeral one
    did (a 64-node run's host failed to bind, "address already in use", and its 16 nodes never came live).

    Raises:
        OSError: no free port found in 2,000 tries.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    taken = taken if taken is not None else set()
    rnd = random.Random()
    for _ in range(2000):
        port = rnd.randrange(10_000, max(10_001, low))
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise OSError("no free port below the ephemeral range")


def free_ports_with_grpc(count: int, *, avoid: Iterable[int] = ()) -> list[int]:
    """Pick ``count`` distinct ports ``p`` such that both ``p`` and ``p + 10000`` are free.

    Args:
        count: How many ports to return.
        avoid: Ports already handed out, which must not be reused (nor their gRPC twins).

    Returns:
        The chosen HTTP ports, each <= 55535 so its gRPC twin is a valid port.

    Raises:
        ServiceStartError: If no such ports were found after many random tries.
    """
    taken = set(avoid)
    chosen: list[int] = []
    for _ in range(500):
        port = random.randrange(_LOW, _HIGH)
        pair = {port, port + GRPC_OFFSET}
        if pair & taken or not all(port_is_free(p) for p in pair):
            continue
        chosen.append(port)
        taken |= pair
        if len(chosen) == count:
            return chosen
    raise ServiceStartError(f"could not find {count} free port pairs in {_LOW}..{_HIGH}")


def pid_alive(pid: int) -> bool:
    """Say whether ``pid`` is running (a zombie counts as gone).

    ``os.kill(pid, 0)`` alone would call a zombie alive, and a zombie never goes away when PID 1 does not reap.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def autogroup_nice(pid: int, nice: int) -> bool:
    """Give ``pid``'s scheduler autogroup (its session) the nice value ``nice``; returns whether it took.

    With ``kernel.sched_autogroup_enabled`` (Linux's default since 2.6.38), the CPU is shared fairly between
    sessions first, and a process's own nice only ranks it against its session's other processes (sched(7),
    "The autogroup feature"). A child started in a session of its own (``start_new_session``) under ``nice -n 10``
    therefore competed as hard as any other session; this writes the session's nice to ``/proc/<pid>/autogroup``.
    False where there is no autogroup (the feature off or absent: then plain nice already works) or the write is
    refused (raising needs root or ``CAP_SYS_NICE``)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        return False
    return True


def wait_until(probe: Callable[[], bool], *, timeout_s: float, what: str,
               proc: subprocess.Popen[bytes] | None = None, log_path: os.PathLike[str] | str | None = None,
               interval_s: float = 0.05) -> None:
    """Poll ``probe`` until it returns True.

    Args:
        probe: Readiness check; exceptions count as "not ready yet".
        timeout_s: Seconds to wait before giving up.
        what: Service name for the error message.
        proc: The service process; if it exits early we fail at once instead of waiting out the timeout.
        log_path: Log file whose tail is put in the error.
        interval_s: Seconds between probes.

    Raises:
        ServiceStartError: On timeout or early exit, with the log tail.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except Exception:  # noqa: BLE001 - any failure just means "not ready yet"
            pass
        if proc is not None and proc.poll() is not None:
            raise ServiceStartError(f"{what} exited with code {proc.returncode}\n{log_tail(log_path)}")
        time.sleep(interval_s)
    raise ServiceStartError(f"{what} not ready after {timeout_s:.0f} s\n{log_tail(log_path)}")


def log_tail(path: os.PathLike[str] | str | None, lines: int = 30) -> str:
    """Return the last ``lines`` lines of a log file, or a note if there is none."""
    if path is None:
        return "(no log)"
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError as exc:
        return f"(log unreadable: {exc})"


def stop_process(proc: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
    """Stop a child by PID: send ``sig``, wait, then SIGKILL if it is still running.

    Args:
        proc: The child process (we reap it with ``wait``).
        sig: Graceful signal; PostgreSQL takes SIGINT for a "fast" shutdown.
        timeout_s: Seconds of grace before SIGKILL.
    """
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
