"""``scripts/simulate --replay``: a bench_fleet recording replayed through the production glue."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from devtools.simulate.__main__ import main
from devtools.simulate.policies import QuiverPolicy
from devtools.simulate.replay import engine_figures, load, measured_costs, simulated_figures

PLAN = {"a": ["node-1"], "b": ["node-1"], "c": ["node-2"], "d": ["node-2"], "e": ["node-2"]}


def _recording(path: Path, *, requests: list[tuple[str, float]], plan: dict[str, list[str]] | None = None,
               nodes: list[str] | None = None, **header_fields: Any) -> Path:
    """Two nodes of 1 GPU / 2 CPU slots; a, b on node-1's engine, c on node-2's, d staged on node-2's disk, e on
    no node. ``nodes``: where the live gateway sent each request (absent when None)."""
    adapters = {n: {"lora_int_id": 10 + i, "size_bytes": 1000, "r": 8} for i, n in enumerate("abcde")}
    header = {"kind": "header", "nodes": ["node-1", "node-2"], "max_loras": 1, "max_cpu_loras": 2,
              "adapters": adapters, "plan": PLAN if plan is None else plan,
              "eviction": "lfu", "concurrency": 2, "max_tokens": 4, "zipf": 1.0, "seed": 3, "load_avg": [1.5, 1.0],
              "state": {"node-1": {"gpu": [10], "cpu": [11, 10], "disk": [10, 11]},
                        "node-2": {"gpu": [12], "cpu": [12], "disk": [12, 13]}}, **header_fields}
    lines = [header, *({"kind": "request", "i": i, "adapter": a, "sent_s": t, "done_s": t + 0.2, "ok": True,
                        **({"node": nodes[i]} if nodes is not None else {})}
                       for i, (a, t) in enumerate(requests)),
             {"kind": "engines", "loads": {n: {"disk_to_cpu": 1, "cpu_to_gpu": 2, "disk_to_cpu_s": 0.05,
                                                 "cpu_to_gpu_s": 0.002} for n in ("node-1", "node-2")},
              "served": {"node-1": {"resident": 5, "loaded": 0}, "node-2": {"resident": 2, "loaded": 1}}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_recording_replays_from_its_recorded_state_with_its_measured_costs(tmp_path: Path) -> None:
    trace = [("a", 0.0), ("b", 0.3), ("a", 0.6), ("c", 0.9), ("d", 1.2), ("c", 1.5), ("a", 1.8), ("b", 2.1)]
    rec = load(_recording(tmp_path / "run.jsonl", requests=trace))

    costs = measured_costs(rec)
    assert costs.disk_to_cpu_ms(1000) == 50.0 + 1000 / 1e15  # 0.1 s over 2 reads
    assert engine_figures(rec) == {"loads_per_request": 2 / 8, "served_resident": 7 / 8}
    # Every adapter but d starts in an engine where the plan routes it; d's one request reads it from node-2's disk
    # (one load: node-2 has a free CPU slot, so nothing is evicted and c stays resident).
    sim = simulated_figures(rec)
    assert (sim["loads_per_request"], sim["served_resident"]) == (1 / 8, 7 / 8)
    assert (sim["requests:node-1"], sim["requests:node-2"]) == (5, 3)  # the recorded node names, HRW keys
    assert math.isnan(sim["agreement"])  # no live decision recorded


def test_the_replay_says_how_often_it_routed_a_request_where_the_live_gateway_did(tmp_path: Path) -> None:
    trace = [("a", 0.0), ("b", 0.3), ("c", 0.6), ("a", 0.9)]
    live = ["node-1", "node-1", "node-2", "node-2"]  # the last one went elsewhere live
    sim = simulated_figures(load(_recording(tmp_path / "run.jsonl", requests=trace, nodes=live)))
    assert sim["agreement"] == 3 / 4


def test_a_move_serves_the_request_where_the_version_is_and_warms_the_home_behind_it(tmp_path: Path) -> None:
    """The plan moved d to node-1, which does not serve it; node-2 does (from disk). As the gateway does, the
    request goes to node-2 (a load inside the request), and node-1 gets a control-plane warm, a load counted like
    the engines count it; d's next request, after the warm, goes to its home and finds it resident."""
    plan = {**PLAN, "d": ["node-1"]}
    rec = load(_recording(tmp_path / "run.jsonl", requests=[("d", 0.0), ("d", 3.0)], plan=plan))
    sim = simulated_figures(rec, warm_s=1.5)
    assert (sim["requests:node-2"], sim["requests:node-1"]) == (1, 1)
    assert sim["loads_per_request"] == 2 / 2  # the first request's own load and the warm of its home
    assert sim["served_resident"] == 1 / 2


def test_a_version_no_node_serves_is_warmed_at_its_home_and_its_request_counts_resident(tmp_path: Path) -> None:
    """e is on no node: the gateway warms it where warm_target says (its plan home, node-2) and the request waits
    for that warm, so the engine finds it in its CPU cache (``served`` resident) after one load."""
    sim = simulated_figures(load(_recording(tmp_path / "run.jsonl", requests=[("e", 0.0)])))
    assert sim["requests:node-2"] == 1
    assert (sim["loads_per_request"], sim["served_resident"]) == (1.0, 1.0)


def test_the_reconciler_plans_at_the_recorded_passes_from_the_window_rates(tmp_path: Path) -> None:
    """No plan at the start; the recorded pass at 1.0 s plans every version (production asks place for each ready
    one), with the requests before the replay (``prior_requests``) in its rates: e, hot before the replay, gets a
    home though the replay never asked for it."""
    rec = load(_recording(tmp_path / "run.jsonl", requests=[("a", 0.0), ("a", 0.5), ("a", 1.5)], plan={},
                          prior_requests={"e": 600}, reconciles=[1.0]))
    plans: list[dict[int, tuple[str, ...]]] = []
    original = QuiverPolicy.tick

    def tick(self: QuiverPolicy, t: float) -> None:
        original(self, t)
        plans.append(dict(self.plan))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(QuiverPolicy, "tick", tick)
        simulated_figures(rec)
    assert plans[0] == plans[1] == {}  # before the pass
    assert sorted(plans[2]) == [0, 1, 2, 3, 4]  # every version, e (index 4) included


def test_the_command_prints_both_columns(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _recording(tmp_path / "run.jsonl", requests=[("a", 0.0), ("d", 0.5)])
    assert main(["--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "loads/req engines" in out and "| run.jsonl | 1.0 | 3 | 2 | 1.5 | 1.000 | 0.500 | -50.0% |" in out
    assert "same node" in out and "| nan% | 0/1 0/1 |" in out  # no live node recorded; a went to node-1, d to node-2


def test_with_the_batch_limit_a_request_is_counted_where_its_adapter_is_when_the_engine_schedules_it(
        tmp_path: Path) -> None:
    """One LoRA per batch (``max_loras`` 1). a runs; b waits for the batch; e, on no node, is warmed onto node-1 for
    its request, and the node's rule evicts b (not in the running batch, so not busy). When a drains, b is
    scheduled, read back (a load) and counted ``loaded``, as the engine counts it; e, scheduled after b, finds its
    warm. Without the batch limit b runs on arrival, resident, and its busy flag keeps it."""
    plan = {**PLAN, "e": ["node-1"]}
    trace = [("a", 0.0), ("b", 0.05), ("e", 0.1), ("c", 0.3), ("c", 0.6)]
    rec = load(_recording(tmp_path / "run.jsonl", requests=trace, plan=plan))
    deferred = simulated_figures(rec, defer=True)
    assert (deferred["requests:node-1"], deferred["requests:node-2"]) == (3, 2)
    assert deferred["loads_per_request"] == 2 / 5  # e's warm and b's read after its wait
    assert deferred["served_resident"] == 4 / 5  # b loaded
    at_once = simulated_figures(rec, defer=False)
    assert (at_once["loads_per_request"], at_once["served_resident"]) == (1 / 5, 5 / 5)
    default = simulated_figures(rec)  # the replay's default is the batch limit
    assert {k: v for k, v in default.items() if k != "agreement"} == \
        {k: v for k, v in deferred.items() if k != "agreement"}
