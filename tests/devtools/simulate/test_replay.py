"""``scripts/simulate --replay``: a bench_fleet recording replayed through the production glue."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.simulate.__main__ import main
from devtools.simulate.replay import engine_figures, load, measured_costs, simulated_figures


def _recording(path: Path, *, requests: list[tuple[str, float]]) -> Path:
    """Two nodes of 1 GPU / 2 CPU slots; a, b on node-1's engine, c on node-2's, d staged on node-2's disk."""
    adapters = {n: {"lora_int_id": 10 + i, "size_bytes": 1000, "r": 8} for i, n in enumerate("abcd")}
    header = {"kind": "header", "nodes": ["node-1", "node-2"], "max_loras": 1, "max_cpu_loras": 2,
              "adapters": adapters, "plan": {"a": ["node-1"], "b": ["node-1"], "c": ["node-2"], "d": ["node-2"]},
              "eviction": "lfu", "concurrency": 2, "max_tokens": 4, "zipf": 1.0, "seed": 3, "load_avg": [1.5, 1.0],
              "state": {"node-1": {"gpu": [10], "cpu": [11, 10], "disk": [10, 11]},
                        "node-2": {"gpu": [12], "cpu": [12], "disk": [12, 13]}}}
    lines = [header, *({"kind": "request", "i": i, "adapter": a, "sent_s": t, "done_s": t + 0.2, "ok": True}
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
    assert simulated_figures(rec) == {"loads_per_request": 1 / 8, "served_resident": 7 / 8}


def test_the_command_prints_both_columns(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _recording(tmp_path / "run.jsonl", requests=[("a", 0.0), ("d", 0.5)])
    assert main(["--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "loads/req engines" in out and "| run.jsonl | 1.0 | 3 | 2 | 1.5 | 1.000 | 0.500 | -50.0% |" in out
