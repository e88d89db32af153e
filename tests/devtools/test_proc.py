"""``devtools.proc.free_port_outside_ephemeral``: ports picked long before they are bound stay clear of the ports the
kernel hands outgoing connections (a 64-node fleet_scale host failed to bind one that had become a connection's)."""

from __future__ import annotations

import socket
from pathlib import Path

from devtools.proc import free_port_outside_ephemeral


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    taken: set[int] = set()
    ports = [free_port_outside_ephemeral(taken) for _ in range(50)]
    assert len(set(ports)) == 50 and set(ports) == taken
    assert all(10_000 <= p < low for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[0]))
