"""``scripts/bench_fleet_trace.py``: the gateway's route log read back into a recording (each request's live node
and tier, the control plane's warms), and the recording's lines."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quiver_bench_fleet_trace", REPO / "scripts" / "bench_fleet_trace.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


LOG = """\
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.route rid=aa node=node-1 version_id=7 tier=warm reroutes=0 t=1000.25
uvicorn noise line
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.route rid=bb node=node-2 version_id=8 tier=staged reroutes=1 t=1001.5
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.route rid=cc node=node-2 version_id=9 tier=hot reroutes=0 t=1001.6
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.route rid=dd node=node-1 version_id=7 tier=hot reroutes=0 t=999.0
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.move version_id=8 node_pk=1 t=1001.5
2025-01-01 00:00:00,000 INFO inference.gateway.route gateway.warm version_id=7 node_pk=2 t=1002.0
"""


def test_the_route_log_gives_each_request_its_live_node_and_tier_and_the_warms_their_times() -> None:
    trace = _load()
    routes, warms = trace.route_events(LOG, start_unix=1000.0, names={7: "a", 8: "b"}, nodes={1: "node-1", 2: "node-2"})
    # Matched by vLLM's answer id; lines before the replay's start (dd) and of other versions (cc) left out.
    assert routes == {"cmpl-aa": {"node": "node-1", "tier": "warm", "reroutes": 0},
                      "cmpl-bb": {"node": "node-2", "tier": "staged", "reroutes": 1}}
    assert warms == [{"kind": "warm", "how": "move", "adapter": "b", "node": "node-1", "t_s": 1.5},
                     {"kind": "warm", "how": "wait", "adapter": "a", "node": "node-2", "t_s": 2.0}]


def test_a_recording_holds_the_live_decisions_and_events_in_time_order(tmp_path: Path) -> None:
    trace = _load()
    snap = {"gpu": [7], "cpu": [7], "disk": [7], "served": {"resident": 1, "loaded": 0},
            "moves": {"disk_to_cpu": 1, "cpu_to_gpu": 1, "disk_to_cpu_s": 0.1, "cpu_to_gpu_s": 0.01}}
    after = {**snap, "served": {"resident": 3, "loaded": 1},
             "moves": {"disk_to_cpu": 3, "cpu_to_gpu": 2, "disk_to_cpu_s": 0.2, "cpu_to_gpu_s": 0.02}}
    out = tmp_path / "run.jsonl"
    trace.write_trace(out, header={"nodes": ["node-1"]}, before={"node-1": snap}, after={"node-1": after},
                      requests=[{"i": 1, "adapter": "a", "sent_s": 0.5, "node": "node-1", "tier": "warm"},
                                {"i": 0, "adapter": "a", "sent_s": 0.1, "node": "node-1", "tier": "staged"}],
                      events=[{"kind": "warm", "how": "move", "adapter": "a", "node": "node-1", "t_s": 0.3},
                              {"kind": "plan", "t_s": 0.2, "plan": {"a": ["node-1"]}}])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["header", "request", "request", "plan", "warm", "engines"]
    assert [line.get("tier") for line in lines[1:3]] == ["staged", "warm"]
    assert lines[-1]["loads"]["node-1"]["disk_to_cpu"] == 2 and lines[-1]["served"]["node-1"] == {"resident": 2,
                                                                                                    "loaded": 1}
