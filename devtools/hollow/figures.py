"""The scale run's figures: read the probes' files and the hosts' engine counters, run the simulator on the same
trace and cost model, and print the SLO table (issue 31's keys and targets)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devtools.hollow.costs import EngineCosts
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import Policy, QuiverPolicy, Reconciler
from devtools.simulate.run import simulate
from devtools.simulate.workload import Trace
from inference.policy.eviction import EvictionPolicy
from inference.policy.tiers import Tier

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


def simulated(trace: Trace, costs: EngineCosts, *, nodes: Sequence[str], ids: Sequence[int],
              evictions: Sequence[tuple[float, str, int]] = (), reconciles: Sequence[float] | None = None,
              prior: Mapping[int, int] | None = None, gpu_slots: int, cpu_slots: int, max_tokens: int,
              seed: int) -> dict[str, float]:
    """The simulator's Quiver policy on the run's ``trace`` with the emulator's move costs and a service time from
    its step cost, modelling what the live run does (:func:`simulate_like_live`): its node names and version ids
    (``nodes``; ``ids[adapter]``: the HRW keys), the upload-time warms before the trace, production's reconciler
    and the operator's ``evictions`` ((s from the replay's start, node name, version id)) at their times, re-planning
    at the live reconciler's pass times ``reconciles`` (s from the replay's start; None: every 30 s from it) with
    ``prior`` (adapter index → requests before the replay) in its rate window (``sim_served_resident_share``,
    ``sim_loads_per_1k``); beside it the same from a cold fleet (``sim_cold_…``)."""
    rec = {"times": trace.times.tolist(), "adapters": trace.adapters.tolist(), "rank_of": list(trace.rank_of),
           "tenant_of": list(trace.tenant_of), "ids": list(ids), "nodes": list(nodes), "evictions": list(evictions),
           "reconciles": None if reconciles is None else list(reconciles), "prior": dict(prior or {})}
    warm = simulate_like_live(rec, costs, None, gpu_slots=gpu_slots, cpu_slots=cpu_slots, max_tokens=max_tokens,
                              seed=seed)
    cold = simulate_like_live(rec, costs, {}, gpu_slots=gpu_slots, cpu_slots=cpu_slots, max_tokens=max_tokens,
                              seed=seed)

    def resident(f: Mapping[str, float]) -> float:
        return f["served_gpu"] + f["served_cpu"]

    return {"sim_served_resident_share": resident(warm), "sim_loads_per_1k": warm["loads_per_1k"],
            "sim_cold_served_resident_share": resident(cold), "sim_cold_loads_per_1k": cold["loads_per_1k"],
            "sim_requests": float(len(trace.times))}


def simulate_like_live(rec: Mapping[str, Any], costs: EngineCosts, start: Mapping[str, set[int]] | None, *,
                       gpu_slots: int, cpu_slots: int, max_tokens: int, seed: int,
                       choices: list[tuple[str, Tier, bool]] | None = None) -> dict[str, float]:
    """The simulator on a run's record (``scripts/fleet_scale --record``'s keys ``times``, ``adapters``,
    ``rank_of``, ``tenant_of``, ``ids``, ``nodes``, ``evictions``): the live node names and version ids (the HRW
    keys), the operator's evictions at their times, production's reconciler (``Reconciler``: the requests of the
    last 600 s over 600 s, ``prior`` ones included, at the live pass times ``reconciles`` when recorded, else every
    30 s as ``fleet_reconcile`` on beat) and, as the fleet's state at the
    replay's start, ``start`` (node → version ids its engine held; ``{}``: a cold fleet) or, when None, the
    upload-time warms in version order (``QuiverPolicy.upload_warms``: every version on ``warm_target``'s node, as
    ``placement_on_ready`` does as each becomes ready). ``choices`` gets each request's (node, tier on arrival,
    found in the engine). Returns the simulator's figures (``devtools.simulate.run.METRICS``)."""
    trace = Trace(times=np.asarray(rec["times"], dtype=np.float64), adapters=np.asarray(rec["adapters"]),
                  total_adapters=len(rec["rank_of"]), tenant_of=list(rec["tenant_of"]), rank_of=list(rec["rank_of"]))
    sim_costs = costs.to_sim()
    sizes = [sim_costs.size(r) for r in trace.rank_of]
    service_s = max_tokens * costs.step_ms(1, 1, 0) / 1000 + costs.prefill_ms_per_token * 8 / 1000
    names = list(rec["nodes"])
    fleet = FleetSpec(nodes=len(names), gpu_slots=gpu_slots, cpu_slots=cpu_slots, concurrency=costs.max_num_seqs,
                      service_s=service_s)
    index = {v: a for a, v in enumerate(rec["ids"])}
    unloads = [(float(at), node, index[v]) for at, node, v in rec["evictions"] if v in index]
    passes = rec.get("reconciles")  # the live passes after the replay's start (earlier ones planned idle versions)
    passes = None if passes is None else [float(t) for t in passes if t >= 0]
    prior = rec.get("prior") or {}

    def make(sim_nodes: list[SimNode]) -> Policy:
        return QuiverPolicy(sim_nodes, seed=seed, sizes=sizes, ranks=trace.rank_of, tenants=trace.tenant_of,
                            costs=sim_costs, eviction=EvictionPolicy("lfu"), ids=rec["ids"], unloads=unloads,
                            reconciler=Reconciler(passes=passes, prior={int(a): int(n) for a, n in prior.items()}))

    def prepare(sim_nodes: list[SimNode], policy: Policy) -> None:
        assert isinstance(policy, QuiverPolicy)
        if start is None:
            policy.upload_warms(sorted(range(len(sizes)), key=lambda a: rec["ids"][a]))
            return
        for node in sim_nodes:
            for v in sorted(start.get(node.name, ())):
                if v in index:
                    node.disk[index[v]] = sizes[index[v]]
                    node.disk_used += sizes[index[v]]
                    node.engine.add_lora(index[v])

    return simulate(trace, fleet, sim_costs, sizes, make, seed=seed, prepare=prepare, node_names=names,
                    choices=choices).figures


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


def waits(sent: Sequence[float], began: Sequence[float], within_s: float = 60.0) -> list[float]:
    """Milliseconds from each time in ``sent`` to the first time in ``began`` at or after it (within ``within_s``),
    each ``began`` used once: how long each of a run's operator evictions waited in the queue before its task ran
    (both in Unix seconds, from one clock)."""
    starts = sorted(began)
    out: list[float] = []
    i = 0
    for t in sorted(sent):
        while i < len(starts) and starts[i] < t:
            i += 1
        if i < len(starts) and starts[i] - t <= within_s:
            out.append((starts[i] - t) * 1000)
            i += 1
    return out
