"""Per-request comparison of a live scale run (``scripts/fleet_scale --record PATH``) with the simulator on the
same trace: which node each request went to, the tier its adapter was in there on arrival, and what every engine
load was for.

Usage: ``python -m devtools.hollow.compare RECORD.json [--calibration h100-8b] [--max-tokens 16] [--seed 1]``.

The record (``scripts/fleet_scale.record``) holds the trace, each adapter's version id, the node names, the
operator's evictions and the hollow engines' events (``HollowEngine.events``), times in s from the replay's start.
A live request is matched to its trace request by adapter and order of arrival (the ``k``-th arrival of a version at
any engine is its ``k``-th request in the trace; the warm-up requests before the replay are left out).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devtools.hollow.costs import calibration
from devtools.simulate.workload import Trace

RESIDENT = ("gpu", "cpu")


@dataclass(frozen=True)
class Live:
    """The live run, per request and per engine.

    Attributes:
        node: per trace request, the node that served it ("" when no arrival matched: refused or lost).
        tier: per trace request, its adapter's tier there on arrival (``gpu``/``cpu``/``disk``/``cold``/``warmed``).
        loads: per (node, source) the engine loads (disk → CPU) during the replay.
        start: per node, the version ids its engine's CPU cache held when the replay started.
        drops: per (node, version id), the times (s) and kinds (``lru``/``remove``) it left that engine's CPU cache.
    """

    node: list[str]
    tier: list[str]
    loads: Counter[tuple[str, str]]
    start: dict[str, set[int]]
    drops: dict[tuple[str, int], list[tuple[float, str]]]


def read_live(rec: Mapping[str, Any]) -> Live:
    """Match the engines' arrival events to the trace's requests; count loads, starting contents and drops."""
    ids: list[int] = rec["ids"]
    per_version: dict[int, list[int]] = defaultdict(list)  # version id -> trace indexes, in order
    for i, a in enumerate(rec["adapters"]):
        per_version[ids[a]].append(i)
    arrivals: dict[int, list[tuple[float, str, str]]] = defaultdict(list)
    loads: Counter[tuple[str, str]] = Counter()
    start: dict[str, set[int]] = {n: set() for n in rec["nodes"]}
    drops: dict[tuple[str, int], list[tuple[float, str]]] = defaultdict(list)
    for node, events in rec["engines"].items():
        for at, v, what in sorted(events, key=lambda e: e[0]):
            kind, _, detail = what.partition(":")
            if at < 0:  # before the replay: what the engine held at its start
                if kind == "load" or (kind == "arrive" and detail not in RESIDENT):
                    start[node].add(v)
                elif kind == "drop":
                    start[node].discard(v)
                continue
            if kind == "arrive":
                arrivals[v].append((at, node, detail))
            elif kind == "load":
                loads[node, detail] += 1
            elif kind == "drop":
                drops[node, v].append((at, detail))
    n = len(rec["times"])
    node_of, tier_of = [""] * n, [""] * n
    for v, idx in per_version.items():
        for i, (_, node, tier) in zip(idx, sorted(arrivals.get(v, [])), strict=False):
            node_of[i], tier_of[i] = node, tier
    return Live(node_of, tier_of, loads, start, drops)


def trace_of(rec: Mapping[str, Any]) -> Trace:
    """The recorded trace as ``devtools.simulate.workload.Trace``."""
    return Trace(times=np.asarray(rec["times"], dtype=np.float64), adapters=np.asarray(rec["adapters"], dtype=np.int64),
                 total_adapters=len(rec["rank_of"]), tenant_of=list(rec["tenant_of"]), rank_of=list(rec["rank_of"]))


def miss_causes(rec: Mapping[str, Any], live: Live) -> Counter[str]:
    """Why each live request that found its adapter outside the engine did: ``first_on_node`` (this node never
    held it before), ``operator_evict`` / ``node_evict`` (the agent or the operator removed it from this engine;
    an operator eviction is one of ``rec["evictions"]`` within 5 s before the drop), ``engine_lru`` /
    ``engine_policy`` (the engine's own load into a full CPU cache dropped it: by vLLM's LRU / by the worker
    extension's rule), or ``held_at_start_dropped_before`` (dropped before the replay)."""
    ops = defaultdict(list)
    for at, node, v in rec["evictions"]:
        ops[node, v].append(at)
    out: Counter[str] = Counter()
    ids = rec["ids"]
    seen: set[tuple[str, int]] = {(n, v) for n, vs in live.start.items() for v in vs}
    for i, (node, tier) in enumerate(zip(live.node, live.tier, strict=True)):
        v = ids[rec["adapters"][i]]
        t = rec["times"][i]
        if not node:
            out["unmatched"] += 1
            continue
        if tier in RESIDENT:
            seen.add((node, v))
            continue
        before = [d for d in live.drops.get((node, v), []) if d[0] <= t + 0.5]
        if before:
            at, kind = before[-1]
            if kind in ("lru", "policy"):
                out[f"{tier}:engine_{kind}"] += 1
            elif any(at - 5.0 <= o <= at + 0.5 for o in ops.get((node, v), [])):
                out[f"{tier}:operator_evict"] += 1
            else:
                out[f"{tier}:node_evict"] += 1
        elif (node, v) in seen:
            out[f"{tier}:held_at_start_dropped_before"] += 1
        else:
            out[f"{tier}:first_on_node"] += 1
        seen.add((node, v))
    return out


def summary(rec: Mapping[str, Any], live: Live, sim_choices: Sequence[tuple[str, Any, bool]] | None = None,
            sim_figures: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Live and (when given) simulated per-request figures side by side: shares by arrival tier, loads per 1,000
    by source, per-node requests, how often both sent a request to the same node, and the live misses' causes."""
    n = len(rec["times"])
    tiers = Counter(live.tier)
    out: dict[str, Any] = {
        "requests": n, "matched": n - tiers.get("", 0),
        "live_tiers": {k or "unmatched": v / n for k, v in sorted(tiers.items())},
        "live_resident_share": sum(tiers[t] for t in RESIDENT) / n,
        "live_loads_per_1k": {f"{s}": 1000 * c / n for s, c in sorted(Counter(
            {s: sum(v for (_, src), v in live.loads.items() if src == s) for _, s in live.loads}).items())},
        "live_start_held": sum(len(v) for v in live.start.values()),
        "live_start_per_node": sorted(len(v) for v in live.start.values()),
        "live_requests_per_node": sorted(Counter(x for x in live.node if x).values()),
        "live_miss_causes": dict(miss_causes(rec, live).most_common()),
        "operator_evictions": len(rec["evictions"]),
    }
    if sim_choices is not None:
        same = sum(1 for a, (b, _, _) in zip(live.node, sim_choices, strict=True) if a and a == b)
        out["sim_same_node"] = same / max(1, out["matched"])
        out["sim_tiers"] = dict(Counter(t.value for _, t, _ in sim_choices))
        out["sim_requests_per_node"] = sorted(Counter(b for b, _, _ in sim_choices).values())
        both = Counter((live.tier[i] in RESIDENT, sim_choices[i][1].value in RESIDENT) for i in range(n))
        out["resident_live_vs_sim"] = {f"live={a} sim={b}": c for (a, b), c in sorted(both.items())}
    if sim_figures is not None:
        out["sim_figures"] = dict(sim_figures)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the comparison of a ``--record`` file as JSON; returns the exit status."""
    from devtools.hollow.figures import simulate_like_live

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("record", type=Path)
    p.add_argument("--calibration", default="h100-8b")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--gpu-slots", type=int, default=4)
    p.add_argument("--cpu-slots", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rec = json.loads(args.record.read_text())
    live = read_live(rec)
    choices: list[tuple[str, Any, bool]] = []
    figures = simulate_like_live(rec, calibration(args.calibration), live.start, gpu_slots=args.gpu_slots,
                                 cpu_slots=args.cpu_slots, max_tokens=args.max_tokens, seed=args.seed,
                                 choices=choices)
    print(json.dumps(summary(rec, live, choices, figures), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
