"""An idle node agent stays quiet at INFO: under 1,000 lines an hour (issue 30 point 7).

The agent reads the engine's ``/metrics`` every 100 ms (``inference.node.load_publisher``) and heartbeats every
second here; httpx logged each of those requests at INFO, ~36,000 lines an hour on a node serving nothing. And an
idle node is still probed: Kubernetes asks the agent's ``/healthz`` every 5 s and Prometheus scrapes its ``/metrics``
every 15 s, each a uvicorn access line at INFO (~960 an hour); here both are asked every second.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest

from inference.logfmt import CHATTY_LOGGERS, configure

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 10.0
BUDGET_PER_HOUR = 1_000


def _info_lines(log: Path, start: int) -> list[str]:
    text = log.read_bytes()[start:].decode(errors="replace")
    # The agent's own key=value lines (" INFO "), and uvicorn's ("INFO:     127.0.0.1:5000 - \"GET /healthz ...").
    return [line for line in text.splitlines() if " INFO " in line or line.startswith("INFO:")]


def test_an_idle_agent_logs_under_1000_info_lines_an_hour(live_node, node_agent) -> None:  # type: ignore[no-untyped-def]
    log = Path(node_agent.cache_dir).parent / f"agent-{node_agent.node_name}.log"
    assert log.exists(), "the agent's log file (tests.fixtures.stack.start_agent) moved"
    start = log.stat().st_size
    probes = 0
    deadline = time.monotonic() + WINDOW_S  # the measured idle window itself, not a wait for anything
    while time.monotonic() < deadline:
        for path in ("/healthz", "/metrics"):
            assert httpx.get(node_agent.url + path, timeout=10).status_code == 200
            probes += 1
        time.sleep(1.0)
    assert probes >= 10
    lines = _info_lines(log, start)
    per_hour = len(lines) * 3600 / WINDOW_S
    assert per_hour < BUDGET_PER_HOUR, f"{len(lines)} INFO lines in {WINDOW_S:.0f} s idle, e.g. {lines[:3]}"


def test_debug_still_traces_every_request() -> None:
    # configure() quiets the HTTP clients only above DEBUG: asking for DEBUG keeps their per-request lines.
    saved = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    try:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        configure("DEBUG")
        assert [logging.getLogger(name).level for name in CHATTY_LOGGERS] == [logging.NOTSET] * len(CHATTY_LOGGERS)
        configure("INFO")
        assert [logging.getLogger(name).level for name in CHATTY_LOGGERS] == [logging.WARNING] * len(CHATTY_LOGGERS)
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
