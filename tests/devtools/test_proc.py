"""``devtools.proc.free_port_outside_ephemeral``: ports picked long before they are bound stay clear of the ports the
kernel hands outgoing connections (a 64-node fleet_scale host failed to bind one that had become a connection's)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from devtools.proc import autogroup_nice, free_port_outside_ephemeral


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    taken: set[int] = set()
    ports = [free_port_outside_ephemeral(taken) for _ in range(50)]
    assert len(set(ports)) == 50 and set(ports) == taken
    assert all(10_000 <= p < low for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_child_in_its_own_session_gets_its_sessions_nice() -> None:
    """``nice -n 10`` alone does not lower a child in a session of its own against other sessions (autogroup);
    ``autogroup_nice`` sets the session's, where the kernel has the feature."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        group = Path(f"/proc/{child.pid}/autogroup")
        took = autogroup_nice(child.pid, 10)
        if group.exists():
            assert took
            assert group.read_text().split()[-1] == "10"  # "/autogroup-<n> nice 10"
        else:  # no autogroup: plain nice already ranks every process
            assert not took
    finally:
        child.kill()
        child.wait()
