"""The scale run's figures: read the probes' files and the hosts' engine counters, run the simulator on the same
trace and cost model, and print the SLO table (issue 31's keys and targets)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from devtools.hollow.costs import EngineCosts
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import Policy, QuiverPolicy
from devtools.simulate.run import simulate
from devtools.simulate.workload import Trace
from inference.policy.eviction import EvictionPolicy

PROBE_DUMP_S = 2.0  # devtools.hollow.probes.DUMP_EVERY_S

# key → (target, "max" | "min" | "eq" | "near"), issue 31's acceptance
TARGETS: dict[str, tuple[float, str]] = {
    "heartbeat_ms_p99": (50, "max"), "fleet_view_ms_p99": (20, "max"), "fleet_view_cpu_share": (0.05, "max"),
    "propagation_ms_p99": (1000, "max"), "reconcile_ms_p99": (1000, "max"), "api_ms_p99": (300, "max"),
    "gateway_errors_5xx": (0, "eq"),
}


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile, None when there are no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def read_probes(probe_dir: Path, kind: str) -> list[dict[str, Any]]:
    """Every ``<kind>-<pid>.json`` the probes wrote."""
    out = []
    for path in sorted(probe_dir.glob(f"{kind}-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def samples(files: Sequence[Mapping[str, Any]], key: str, skip: Mapping[int, int] | None = None) -> list[float]:
    """All samples of ``key`` over ``files``, less the first ``skip[i]`` of file ``i`` (taken before the window)."""
    out: list[float] = []
    for i, f in enumerate(files):
        values = f.get("samples", {}).get(key, [])
        out += values[(skip or {}).get(i, 0):]
    return out


def counts(files: Sequence[Mapping[str, Any]], key: str) -> dict[int, int]:
    """How many samples of ``key`` each file holds now (the window's start)."""
    return {i: len(f.get("samples", {}).get(key, [])) for i, f in enumerate(files)}


def engine_totals(hosts: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Sums of the emulated engines' counters over every host."""
    totals: dict[str, float] = {"loads_total": 0, "requests": 0, "resident": 0, "busy_s": 0, "preemptions": 0,
                                "loads_add_lora": 0, "loads_request": 0, "warmed": 0}
    for host in hosts:
        for engine in host.get("engines", {}).values():
            tiers = engine.get("arrival_tiers", {})
            totals["loads_total"] += engine["loads_total"]
            totals["requests"] += engine["requests"]
            totals["resident"] += tiers.get("gpu", 0) + tiers.get("cpu", 0)
            totals["busy_s"] += engine["busy_s"]
            totals["preemptions"] += engine["preemptions"]
            totals["loads_add_lora"] += engine.get("load_sources", {}).get("add_lora", 0)
            totals["loads_request"] += engine.get("load_sources", {}).get("request", 0)
            totals["warmed"] += tiers.get("warmed", 0)
    return totals


def simulated(trace: Trace, costs: EngineCosts, *, nodes: int, gpu_slots: int, cpu_slots: int,
              max_tokens: int, seed: int) -> dict[str, float]:
    """The simulator's Quiver policy on ``trace`` with the emulator's move costs and a service time from its step
    cost. The live fleet starts warm (every version is warmed at upload), the simulator cold; so the trace is also
    replayed twice in a row and the second pass's figures taken (``sim_served_resident_share``,
    ``sim_loads_per_1k``), beside the cold single pass (``sim_cold_…``)."""
    sim_costs = costs.to_sim()
    sizes = [sim_costs.size(r) for r in trace.rank_of]
    service_s = max_tokens * costs.step_ms(1, 1, 0) / 1000 + costs.prefill_ms_per_token * 8 / 1000
    fleet = FleetSpec(nodes=nodes, gpu_slots=gpu_slots, cpu_slots=cpu_slots, concurrency=costs.max_num_seqs,
                      service_s=service_s)

    def make(sim_nodes: list[SimNode]) -> Policy:
        return QuiverPolicy(sim_nodes, seed=seed, sizes=sizes, ranks=trace.rank_of, tenants=trace.tenant_of,
                            costs=sim_costs, eviction=EvictionPolicy("lfu"))

    n = len(trace.times)
    span = float(trace.times[-1]) + float(trace.times[0])
    twice = replace(trace, times=np.concatenate([trace.times, trace.times + span]),
                    adapters=np.concatenate([trace.adapters, trace.adapters]))
    once = simulate(trace, fleet, sim_costs, sizes, make, seed=seed).figures
    both = simulate(twice, fleet, sim_costs, sizes, make, seed=seed).figures

    def resident(f: Mapping[str, float]) -> float:
        return f["served_gpu"] + f["served_cpu"]

    return {"sim_served_resident_share": 2 * resident(both) - resident(once),
            "sim_loads_per_1k": 2 * both["loads_per_1k"] - once["loads_per_1k"],
            "sim_cold_served_resident_share": resident(once), "sim_cold_loads_per_1k": once["loads_per_1k"],
            "sim_requests": float(n)}


def verdict(key: str, value: Any) -> str:
    """``ok`` / ``MISS`` against the issue's target, or ``—`` when the key has none or no value."""
    if key not in TARGETS or value is None:
        return "—"
    target, how = TARGETS[key]
    ok = value <= target if how == "max" else value == target
    return "ok" if ok else "MISS"


def table(figures: Mapping[str, Any]) -> list[str]:
    """The figures as a Markdown table with each target and verdict."""
    lines = ["| key | value | target | verdict |", "|---|---|---|---|"]
    for key, value in figures.items():
        if isinstance(value, dict | list):
            continue
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        target = TARGETS.get(key)
        goal = ("≤ " if target[1] == "max" else "= ") + f"{target[0]:g}" if target else ""
        if key == "served_resident_share":
            goal = "sim ± 0.05"
        elif key == "loads_per_1k":
            goal = "sim ± 15 %"
        lines.append(f"| {key} | {shown} | {goal} | {verdict(key, value)} |")
    return lines
