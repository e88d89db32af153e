"""The scale-out proof (scripts/scaleout.py) passes on the suite's PostgreSQL, Redis and S3 server.

It runs as its own process tree (two gateways, two CPU vLLM nodes with agents, two workers) in a fresh database,
Redis db and bucket, so it shares nothing with the suite's own stack but the servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_gateways_two_nodes_survive_a_kill_of_each(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "scaleout.py"), "--json", str(summary_path),
         "--workdir", str(tmp_path / "run")],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=900, check=False,
    )
    print(done.stdout[-6000:])  # the printed summary, kept in the test log
    assert summary_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["errors_unexplained"] == [], summary["errors_unexplained"]
    assert summary["served_by_gateway"].get("gateway-1", 0) > 0 and summary["served_by_gateway"].get("gateway-2", 0) > 0
    assert all(count > 0 for count in summary["served_by_node"].values()), summary["served_by_node"]
    assert summary["served_after_kills"] > 0
    assert summary["converged"], summary["residency"]
    assert not summary["residency"]["node-2"]["live"]
    assert done.returncode == 0, done.stdout[-3000:]
