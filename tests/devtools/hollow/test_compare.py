"""The scale run's simulator side (``devtools.hollow.figures.simulated``) and its per-request comparison with a
recorded live run (``devtools.hollow.compare``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from devtools.hollow.compare import miss_causes, read_live, summary
from devtools.hollow.costs import calibration
from devtools.hollow.figures import simulate_like_live, simulated
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import QuiverPolicy
from devtools.simulate.workload import Trace
from inference.policy.placement import WarmCandidate, warm_target

NODES = ["node-001", "node-002", "node-003"]


def _policy(adapters: int = 6) -> tuple[QuiverPolicy, list[SimNode]]:
    costs = calibration("h100-8b").to_sim()
    nodes = [SimNode(n, FleetSpec(nodes=3, gpu_slots=1, cpu_slots=2)) for n in NODES]
    policy = QuiverPolicy(nodes, seed=1, sizes=[1000] * adapters, ranks=[8] * adapters, tenants=[0] * adapters,
                          costs=costs, ids=[100 + a for a in range(adapters)])
    return policy, nodes


def test_upload_warms_load_each_version_where_warm_target_puts_it_and_count_nothing() -> None:
    policy, nodes = _policy(adapters=4)
    policy.upload_warms(range(4))
    candidates = [WarmCandidate(n, policy.costs.max_lora_rank) for n in NODES]
    for a in range(4):
        home = warm_target(100 + a, r=8, candidates=candidates)
        node = next(n for n in nodes if n.name == home)
        assert a in node.disk  # on its node's disk at least (its engine may have made room since)
    assert sum(len(n.engine.cpu) for n in nodes) >= 3
    assert policy.extra_loads == policy.extra_fetches == policy.extra_bytes == 0


def test_an_operator_eviction_takes_the_version_off_its_node_at_its_time() -> None:
    policy, nodes = _policy()
    node = nodes[0]
    policy._load(node, 2, 0.0)
    policy._unloads.append((5.0, node.name, 2))
    policy.tick(4.0)
    assert 2 in node.engine.cpu
    policy.tick(5.0)
    assert 2 not in node.engine.cpu and 2 not in node.disk  # no longer served there: routing warms it anew


def _record() -> dict[str, Any]:
    # Adapter 0 (version 100) twice, adapter 1 (version 101) once; node-001 held 100 before the replay.
    return {"times": [0.5, 1.0, 2.0], "adapters": [0, 1, 0], "rank_of": [8, 8], "tenant_of": [0, 0], "ids": [100, 101],
            "nodes": NODES, "evictions": [[1.5, "node-001", 100]],
            "engines": {"node-001": [[-3.0, 100, "load:add_lora"], [-2.9, 100, "probe"], [0.5, 100, "arrive:gpu"],
                                     [1.5, 100, "drop:remove"], [2.0, 101, "load:add_lora"],
                                     [2.1, 100, "load:request"], [2.1, 100, "arrive:cold"]],
                        "node-002": [[1.0, 101, "load:add_lora"], [1.0, 101, "arrive:warmed"]], "node-003": []}}


def test_live_requests_are_matched_by_version_and_order_and_misses_get_their_cause() -> None:
    rec = _record()
    live = read_live(rec)
    assert live.node == ["node-001", "node-002", "node-001"] and live.tier == ["gpu", "warmed", "cold"]
    assert live.start == {"node-001": {100}, "node-002": set(), "node-003": set()}
    assert live.loads == {("node-001", "add_lora"): 1, ("node-001", "request"): 1, ("node-002", "add_lora"): 1}
    assert miss_causes(rec, live) == {"warmed:first_on_node": 1, "cold:operator_evict": 1}
    out = summary(rec, live)
    assert out["live_resident_share"] == 1 / 3 and out["operator_evictions"] == 1


def test_the_simulated_run_starts_from_the_upload_warms_and_replays_the_operator_evictions() -> None:
    costs = calibration("h100-8b")
    rec = _record()
    choices: list[Any] = []
    figures = simulate_like_live(rec, costs, None, gpu_slots=1, cpu_slots=2, max_tokens=4, seed=1, choices=choices)
    assert len(choices) == 3 and figures["served_gpu"] + figures["served_cpu"] >= 1 / 3
    trace = Trace(times=np.array(rec["times"]), adapters=np.array(rec["adapters"]), total_adapters=2,
                  tenant_of=[0, 0], rank_of=[8, 8])
    keys = simulated(trace, costs, nodes=NODES, ids=[100, 101], evictions=[(1.5, "node-001", 100)], gpu_slots=1,
                     cpu_slots=2, max_tokens=4, seed=1)
    # Warmed at upload, both versions are resident for their first requests; a cold fleet loads each.
    assert keys["sim_served_resident_share"] > keys["sim_cold_served_resident_share"]
    assert keys["sim_cold_loads_per_1k"] > keys["sim_loads_per_1k"]


def test_the_simulated_reconciler_plans_at_the_live_pass_times() -> None:
    costs = calibration("h100-8b")
    rec = {**_record(), "prior": {"0": 2}}
    plans: list[float] = []
    original = QuiverPolicy._demands

    def demands(self: QuiverPolicy, t: float) -> Any:
        plans.append(t)
        return original(self, t)

    QuiverPolicy._demands = demands  # type: ignore[method-assign]
    try:
        simulate_like_live({**rec, "reconciles": [-4.0, 0.7, 1.9]}, costs, None, gpu_slots=1, cpu_slots=2,
                           max_tokens=4, seed=1)
    finally:
        QuiverPolicy._demands = original  # type: ignore[method-assign]
    assert plans == [1.0, 2.0]  # at the first request after each pass in the replay (the one before it ignored)
