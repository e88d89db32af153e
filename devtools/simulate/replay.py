"""``scripts/simulate --replay TRACE``: a recorded ``scripts/bench_fleet`` replay (``scripts/bench_fleet_trace.py``'s
JSON lines) through the simulator's production glue (``QuiverPolicy``: ``place``, ``route``, ``node_victims``),
with the costs that run measured on this machine's engines, next to what the engines themselves counted.

What is carried over from the recording: each request's adapter, send time and time on its node (closed-loop
clients: the recorded completion times stand in for the engine's service), each node's engine lists at the start
(CPU cache in LRU order, GPU slots, names served from disk), the reconciler's plan then, the eviction policy, and the
engines' mean disk→CPU and CPU→GPU move times over the run. Compared: engine loads (disk→CPU) per request, and the
served-resident share (requests whose adapter the engine's CPU cache held when they arrived: the engines' own
``served`` count, ``inference.node.worker_ext.note_requests``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devtools.simulate.costs import CostModel
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import WARM_S, Policy, QuiverPolicy, Reconciler
from devtools.simulate.run import simulate
from devtools.simulate.workload import Trace
from inference.policy.eviction import EvictionPolicy
from inference.policy.placement import PlacementConfig
from inference.policy.tiers import Tier

# The CPU node's fixed add_lora cost, when a recording moved nothing to measure it by (docs/placement.md).
DEFAULT_DISK_TO_CPU_MS = 22.0
# What bench_fleet ran with before recordings named them (inference.node.launch.EngineConfig.cpu_dev, --miss-cost).
DEFAULT_MAX_NUM_SEQS = 32
DEFAULT_MISS_COST = 1.0


@dataclass(frozen=True)
class Recorded:
    """One recorded replay: the header, the requests in send order, the engines' own counts."""

    header: dict[str, Any]
    requests: list[dict[str, Any]]
    engines: dict[str, Any]


def load(path: Path) -> Recorded:
    """Read a ``bench_fleet --trace-out`` file.

    Raises:
        ValueError: no header, no request or no engines line.
    """
    header: dict[str, Any] | None = None
    engines: dict[str, Any] | None = None
    requests = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        kind = row.pop("kind", None)
        if kind == "header":
            header = row
        elif kind == "request":
            requests.append(row)
        elif kind == "engines":
            engines = row
    if header is None or engines is None or not requests:
        raise ValueError(f"{path}: not a bench_fleet trace (a header, requests and an engines line)")
    return Recorded(header, sorted(requests, key=lambda r: r["sent_s"]), engines)


def measured_costs(rec: Recorded) -> CostModel:
    """The run's own move times: mean seconds per disk→CPU read and per CPU→GPU copy, summed over the engines."""
    loads = rec.engines["loads"].values()
    reads, read_s = sum(v["disk_to_cpu"] for v in loads), sum(v["disk_to_cpu_s"] for v in loads)
    copies, copy_s = sum(v["cpu_to_gpu"] for v in loads), sum(v["cpu_to_gpu_s"] for v in loads)
    return CostModel(max_lora_rank=16, disk_bytes_per_ms=1e15, pcie_bytes_per_ms=1e15,
                     engine_add_lora_ms=1000.0 * read_s / reads if reads else DEFAULT_DISK_TO_CPU_MS,
                     swap_overhead_ms=1000.0 * copy_s / copies if copies else 0.0)


def engine_figures(rec: Recorded) -> dict[str, float]:
    """What the engines counted: ``loads_per_request`` (disk→CPU reads over the trace's requests) and
    ``served_resident`` (their ``served`` counts: resident over all)."""
    reads = sum(v["disk_to_cpu"] for v in rec.engines["loads"].values())
    resident = sum(v["resident"] for v in rec.engines["served"].values())
    loaded = sum(v["loaded"] for v in rec.engines["served"].values())
    return {"loads_per_request": reads / len(rec.requests),
            "served_resident": resident / (resident + loaded) if resident + loaded else float("nan")}


def simulated_figures(rec: Recorded, *, seed: int = 1, warm_s: float = WARM_S,
                      defer: bool = True) -> dict[str, float]:
    """The same figures from the simulator replaying ``rec`` through ``QuiverPolicy``, plus how its routing compares
    with the live gateway's.

    The simulated reconciler reads rates as production's does (requests of the last 600 s, ``prior_requests``
    from before the replay), with the run's ``miss_cost`` and ``replica_worth``, at the recorded pass times
    (``reconciles``; every 30 s from the start when the recording has none). Nodes keep their recorded names and
    adapters their version ids: both are HRW keys.

    ``defer`` (the default) models vLLM's LoRA batch limit (``FleetSpec.defer``): a request waits for the batch,
    and is counted where its adapter is when it is scheduled (the engines' own moment), with only the running batch
    protected from eviction (the worker's busy set). Off, every request runs and is counted on arrival, as in the
    simulator's main tables.

    Returns:
        ``loads_per_request`` (engine loads, the control plane's warms included, over requests),
        ``served_resident`` (requests that found their adapter in the engine's CPU cache, those that waited for a
        control-plane warm included: the engines' own count), ``agreement`` (share of the requests with a recorded
        node that the simulator sent to the same node; NaN when none has one), ``warms`` (control-plane loads),
        and ``requests:<node>`` per node.
    """
    names = sorted(rec.header["adapters"])
    index = {n: i for i, n in enumerate(names)}
    by_id = {a["lora_int_id"]: index[n] for n, a in rec.header["adapters"].items()}
    ids = [int(rec.header["adapters"][n]["lora_int_id"]) for n in names]
    sizes = [int(rec.header["adapters"][n]["size_bytes"]) for n in names]
    ranks = [int(rec.header["adapters"][n]["r"]) for n in names]
    trace = Trace(times=np.array([r["sent_s"] for r in rec.requests], dtype=np.float64),
                  adapters=np.array([index[r["adapter"]] for r in rec.requests], dtype=np.int64),
                  total_adapters=len(names), tenant_of=[0] * len(names), rank_of=ranks)
    service = [max(r["done_s"] - r["sent_s"], 0.0) for r in rec.requests]
    bench_nodes = list(rec.header["nodes"])
    # The engine's own batch size, not the bench's clients: the simulated KV figure fills at max_num_seqs.
    fleet = FleetSpec(nodes=len(bench_nodes), gpu_slots=int(rec.header["max_loras"]),
                      cpu_slots=int(rec.header["max_cpu_loras"]), disk_bytes=1 << 50,
                      concurrency=int(rec.header.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)), defer=defer)
    costs = measured_costs(rec)
    passes = rec.header.get("reconciles")
    reconciler = Reconciler(prior={index[n]: int(c) for n, c in (rec.header.get("prior_requests") or {}).items()
                                   if n in index},
                            passes=[float(t) for t in passes] if passes is not None else None)
    worth = rec.header.get("replica_worth")
    placement = PlacementConfig(miss_cost=float(rec.header.get("miss_cost", DEFAULT_MISS_COST)),
                                replica_worth=PlacementConfig().replica_worth if worth is None else float(worth))

    def prepare(nodes: list[SimNode], policy: Policy) -> None:
        for node in nodes:
            state = rec.header["state"][node.name]
            for v in state["disk"]:
                if v in by_id:
                    node.disk[by_id[v]] = sizes[by_id[v]]
                    node.disk_used += sizes[by_id[v]]
            for v in state["cpu"]:  # LRU order, oldest first
                if v in by_id:
                    node.engine.add_lora(by_id[v])
            for v in state["gpu"]:
                if v in by_id:
                    node.engine.activate(by_id[v])
        if isinstance(policy, QuiverPolicy):
            policy.plan = {index[n]: tuple(b for b in nodes if b in bench_nodes)
                           for n, nodes in rec.header["plan"].items() if n in index}

    def make(nodes: list[SimNode]) -> Policy:
        return QuiverPolicy(nodes, seed=seed, sizes=sizes, ranks=ranks, tenants=trace.tenant_of, costs=costs,
                            eviction=EvictionPolicy(rec.header.get("eviction", "lfu")), ids=ids, warm_s=warm_s,
                            reconciler=reconciler, placement=placement)

    choices: list[tuple[str, Tier, bool]] = []
    figures = simulate(trace, fleet, costs, sizes, make, seed=seed, service_s=service, prepare=prepare,
                       node_names=bench_nodes, choices=choices).figures
    resident = sum(1 for _, _, found in choices if found)
    live = [(r.get("node"), node) for r, (node, _, _) in zip(rec.requests, choices, strict=True) if r.get("node")]
    out = {"loads_per_request": figures["loads_per_1k"] / 1000.0, "served_resident": resident / len(choices),
           "agreement": sum(a == b for a, b in live) / len(live) if live else float("nan")}
    for node in bench_nodes:
        out[f"requests:{node}"] = sum(1 for n, _, _ in choices if n == node)
    return out


def compare(paths: list[Path], *, warm_s: float = WARM_S, defer: bool = True) -> list[str]:
    """The side-by-side table (markdown) for ``paths``: engines' counts, the simulator's, and the gaps (loads in %,
    the share in points), then how often the simulator routed a request where the live gateway did and each node's
    requests, live / simulated (``defer``: see :func:`simulated_figures`)."""
    head = ["trace", "zipf", "seed", "requests", "load avg", "loads/req engines", "loads/req sim", "Δ loads",
            "served-resident engines", "served-resident sim", "Δ points", "same node", "requests per node live / sim"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for path in paths:
        rec = load(path)
        live, sim = engine_figures(rec), simulated_figures(rec, seed=int(rec.header.get("seed", 1)), warm_s=warm_s,
                                                                defer=defer)
        gap = (sim["loads_per_request"] - live["loads_per_request"]) / live["loads_per_request"] \
            if live["loads_per_request"] else float("nan")
        load_avg = rec.header.get("load_avg") or [float("nan")]
        split = " ".join(f"{sum(1 for r in rec.requests if r.get('node') == n)}/{sim[f'requests:{n}']:.0f}"
                         for n in rec.header["nodes"])
        lines.append("| " + " | ".join([
            path.name, f"{rec.header.get('zipf')}", f"{rec.header.get('seed')}", f"{len(rec.requests)}",
            f"{load_avg[0]:.1f}", f"{live['loads_per_request']:.3f}", f"{sim['loads_per_request']:.3f}",
            f"{gap:+.1%}", f"{live['served_resident']:.1%}", f"{sim['served_resident']:.1%}",
            f"{100 * (sim['served_resident'] - live['served_resident']):+.1f}", f"{sim['agreement']:.1%}",
            split]) + " |")
    return lines
