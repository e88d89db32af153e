"""``scripts/fleet_scale`` end to end at a small size: the real control plane on emulated engines, every key of
issue 31 in its JSON, nothing failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"heartbeat_ms_p50", "heartbeat_ms_p99", "fleet_view_ms_p99", "fleet_view_cpu_share", "propagation_ms_p99",
        "reconcile_ms_p99", "api_ms_p99", "gateway_errors_5xx", "requests", "served_resident_share", "loads_per_1k",
        "sim_served_resident_share", "sim_loads_per_1k", "db_bytes_per_1m_requests", "peak_rss_mib"}


def test_a_small_fleet_runs_and_reports_every_key(tmp_path: Path) -> None:
    # The services the suite runs on (scripts/test sets DATABASE_URL, REDIS_URL, AWS_*): the script makes its own
    # database, Redis db and bucket on them.
    argv = [sys.executable, "-m", "devtools.services", "run", "--", sys.executable, "scripts/fleet_scale.py",
            "--nodes", "3", "--adapters", "12", "--tenants", "3", "--rate", "4", "--duration", "8", "--seed", "2",
            "--gateways", "2", "--evict-every-s", "3", "--heartbeat-s", "1", "--usage-rows", "3000", "--json", "--workdir", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ},
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout)
    assert KEYS <= set(figures)
    assert figures["requests"] == figures["ok"] == 32 and figures["gateway_errors_5xx"] == 0
    assert figures["heartbeats"] > 0 and figures["heartbeat_ms_p99"] >= figures["heartbeat_ms_p50"] > 0
    # An accept's parts: its queries' wall time and the wait before its view ran, each within the whole.
    assert 0 < figures["heartbeat_db_ms_p99"] <= figures["heartbeat_ms_p99"]
    assert 0 <= figures["heartbeat_wait_ms_p99"] <= figures["heartbeat_ms_p99"]
    assert figures["fleet_view_ms_p99"] > 0 and 0 <= figures["fleet_view_cpu_share"] < 1
    assert figures["api_ms_p99"] > 0
    # The pages were timed over the seeded records too (the first tenant's, beside the run's own).
    assert figures["usage_rows"] >= 3000 + figures["ok"] and figures["api_ms_p99_usage_traffic"] > 0
    assert 0 <= figures["served_resident_share"] <= 1 and 0 <= figures["sim_served_resident_share"] <= 1
    assert figures["peak_rss_mib"] > 0
