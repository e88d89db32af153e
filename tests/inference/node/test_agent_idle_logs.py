"""An idle node agent stays quiet at INFO: under 1,000 lines an hour (issue 30 point 7).

The agent reads the engine's ``/metrics`` every 100 ms (``inference.node.load_publisher``) and heartbeats every
second here; httpx logged each of those requests at INFO, ~36,000 lines an hour on a node serving nothing.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from inference.logfmt import CHATTY_LOGGERS, configure

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 10.0
BUDGET_PER_HOUR = 1_000


def _info_lines(log: Path, start: int) -> list[str]:
    text = log.read_bytes()[start:].decode(errors="replace")
    return [line for line in text.splitlines() if " INFO " in line]


def test_an_idle_agent_logs_under_1000_info_lines_an_hour(live_node, node_agent) -> None:  # type: ignore[no-untyped-def]
    log = Path(node_agent.cache_dir).parent / f"agent-{node_agent.node_name}.log"
    assert log.exists(), "the agent's log file (tests.fixtures.stack.start_agent) moved"
    start = log.stat().st_size
    time.sleep(WINDOW_S)  # the measured idle window itself, not a wait for anything
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
