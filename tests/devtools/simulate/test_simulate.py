"""The simulator's command: JSON shape, and Quiver's policy beating round-robin on engine loads (not timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.simulate.workload import WorkloadSpec, generate, popularity_share

ROOT = Path(__file__).resolve().parents[3]
KEYS = {"served_gpu", "served_cpu", "served_disk", "served_cold", "loads_per_1k", "s3_fetches_per_1k",
        "bytes_moved", "added_ms_p50", "added_ms_p99", "load_imbalance"}


@pytest.fixture(scope="module")
def small_run() -> dict:
    out = subprocess.run(
        [str(ROOT / "scripts" / "simulate"), "--adapters", "120", "--nodes", "4", "--gpu-slots", "4",
         "--cpu-slots", "16", "--requests", "15000", "--seed", "3", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    return json.loads(out.stdout)


def test_json_shape(small_run: dict) -> None:
    policies = small_run["policies"]
    assert set(policies) == {"quiver", "random", "round_robin", "least_loaded", "lru_where_loaded"}
    for figures in policies.values():
        assert KEYS <= set(figures)
        served = sum(figures[k] for k in ("served_gpu", "served_cpu", "served_disk", "served_cold"))
        assert served == pytest.approx(1.0)
        assert figures["load_imbalance"] >= 1.0
        assert figures["added_ms_p99"] >= figures["added_ms_p50"] >= 0


def test_quiver_beats_round_robin_on_loads(small_run: dict) -> None:
    p = small_run["policies"]
    assert p["quiver"]["loads_per_1k"] * 2 < p["round_robin"]["loads_per_1k"]
    assert p["quiver"]["served_gpu"] + p["quiver"]["served_cpu"] > p["round_robin"]["served_gpu"] + \
        p["round_robin"]["served_cpu"]


def test_bad_flag_names_the_rule() -> None:
    out = subprocess.run([sys.executable, "-m", "devtools.simulate", "--gpu-slots", "9", "--cpu-slots", "8"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cpu-slots" in out.stderr


def test_workload_matches_the_popularity_law() -> None:
    spec = WorkloadSpec(adapters=500, requests=100_000, zipf=1.0, seed=1)
    assert popularity_share(spec, 256) == pytest.approx(0.902, abs=0.001)  # the bound
    trace = generate(spec)
    counts = sorted((trace.adapters == a).sum() for a in set(trace.adapters.tolist()))[::-1]
    assert sum(counts[:256]) / len(trace.adapters) == pytest.approx(0.902, abs=0.01)
    assert (trace.times[1:] >= trace.times[:-1]).all()


def test_slora_alpha_one_is_uniform() -> None:
    spec = WorkloadSpec(adapters=100, requests=50_000, slora_alpha=1.0, seed=2)
    trace = generate(spec)
    per = [(trace.adapters == a).sum() for a in range(100)]
    assert max(per) < 2 * min(per)
    assert popularity_share(spec, 10) == pytest.approx(0.1)


def test_drift_and_new_versions_change_who_is_hot() -> None:
    spec = WorkloadSpec(adapters=200, requests=40_000, drift=0.5, new_adapters=20, seed=4)
    trace = generate(spec)
    assert trace.total_adapters == 220 and trace.adapters.max() >= 200  # new versions got traffic
    first, last = trace.adapters[:4000], trace.adapters[-4000:]
    top_first = {int(a) for a in set(first.tolist()) if (first == a).sum() > 100}
    top_last = {int(a) for a in set(last.tolist()) if (last == a).sum() > 100}
    assert top_first != top_last
