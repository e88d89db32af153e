"""``./scripts/simulate``: replay one workload against Quiver's policy and the baselines; print a table or JSON.

Example (the acceptance case, docs/placement.md)::

    ./scripts/simulate --adapters 500 --zipf 1.0 --nodes 4 --gpu-slots 8 --cpu-slots 64 --requests 200000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from devtools.simulate.costs import CostModel
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import BASELINES, Policy, QuiverPolicy
from devtools.simulate.run import METRICS, Result, simulate
from devtools.simulate.workload import WorkloadSpec, generate, popularity_share
from inference.policy.eviction import EvictionPolicy
from inference.policy.placement import PlacementConfig
from inference.policy.routing import RouteConfig

POLICIES = ("quiver", "random", "round_robin", "least_loaded", "lru_where_loaded")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (every flag has a default; ``--help`` lists them)."""
    p = argparse.ArgumentParser(prog="simulate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--adapters", type=int, default=500, help="adapter versions at the start")
    w.add_argument("--requests", type=int, default=200_000)
    w.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s of adapter popularity")
    w.add_argument("--slora-alpha", type=float, default=None,
                   help="use S-LoRA's power draw int(power(α)·N) instead of Zipf (α=1 is uniform)")
    w.add_argument("--rate", type=float, default=40.0, help="fleet arrival rate, requests/s")
    w.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of gaps (1 = Poisson)")
    w.add_argument("--tenants", type=int, default=50)
    w.add_argument("--on-off", type=float, default=0.0, help="share of tenants silent every other window")
    w.add_argument("--on-off-period", type=float, default=60.0, help="on/off window, seconds")
    w.add_argument("--drift", type=float, default=0.0, help="share of adapters swapping popularity per epoch")
    w.add_argument("--drift-epochs", type=int, default=10)
    w.add_argument("--new-adapters", type=int, default=0, help="new versions arriving, each retiring an old one")
    w.add_argument("--seed", type=int, default=1)
    f = p.add_argument_group("fleet")
    f.add_argument("--nodes", type=int, default=4)
    f.add_argument("--gpu-slots", type=int, default=8, help="--max-loras per node")
    f.add_argument("--cpu-slots", type=int, default=64, help="--max-cpu-loras per node")
    f.add_argument("--disk-gb", type=float, default=20.0, help="node disk cache budget, GiB")
    f.add_argument("--concurrency", type=int, default=32, help="requests a node runs at once")
    f.add_argument("--service-s", type=float, default=2.0, help="mean request time on a node, seconds")
    q = p.add_argument_group("quiver policy")
    q.add_argument("--eviction", choices=[e.value for e in EvictionPolicy], default="lfu")
    q.add_argument("--replan-s", type=float, default=30.0, help="seconds between placement runs")
    q.add_argument("--load-bound", type=float, default=PlacementConfig().load_bound,
                   help="placement's bounded-load c: a node takes at most c x the mean node rate")
    q.add_argument("--replica-util", type=float, default=PlacementConfig().replica_util,
                   help="share of a mean node's rate one replica carries before another is added")
    q.add_argument("--miss-cost", type=float, default=PlacementConfig().miss_cost,
                   help="placement books a version colder than the slot frontier at rate x (1 + this)")
    q.add_argument("--replica-worth", type=float, default=PlacementConfig().replica_worth,
                   help="over-subscribed fleets: an extra replica must carry this many times the slot frontier's rate")
    q.add_argument("--route-bound", type=float, default=RouteConfig().load_bound,
                   help="routing's bounded-load c over the candidates' mean load (+1)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of policies to run")
    p.add_argument("--json", action="store_true", help="print {\"policies\": {name: figures}} only")
    p.add_argument("--replay", type=Path, action="append", default=None, metavar="TRACE",
                   help="replay a scripts/bench_fleet --trace-out recording through the production glue and print "
                        "the engines' figures beside the simulator's (repeatable); other flags are ignored")
    p.add_argument("--replay-at-arrival", action="store_true",
                   help="with --replay: no LoRA batch limit (every request runs, and is counted, on arrival, as in "
                        "the main tables) instead of vLLM's (a request waits for the batch and is counted where its "
                        "adapter is when scheduled); docs/placement.md compares both")
    args = p.parse_args(argv)
    if args.gpu_slots < 1 or args.cpu_slots < args.gpu_slots or args.nodes < 1:
        p.error("need --nodes ≥ 1 and 1 ≤ --gpu-slots ≤ --cpu-slots (vLLM's rule)")
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        p.error(f"--policies: unknown {', '.join(sorted(unknown))}; choose from {', '.join(POLICIES)}")
    return args


def run(args: argparse.Namespace) -> tuple[dict[str, Result], dict[str, float]]:
    """Run every requested policy on the same trace; returns results and the bound."""
    spec = WorkloadSpec(adapters=args.adapters, requests=args.requests, zipf=args.zipf, slora_alpha=args.slora_alpha,
                        rate=args.rate, cv=args.cv, tenants=args.tenants, on_off=args.on_off,
                        on_off_period_s=args.on_off_period, drift=args.drift, drift_epochs=args.drift_epochs,
                        new_adapters=args.new_adapters, seed=args.seed)
    trace = generate(spec)
    costs = CostModel()
    sizes = [costs.size(r) for r in trace.rank_of]
    fleet = FleetSpec(nodes=args.nodes, gpu_slots=args.gpu_slots, cpu_slots=args.cpu_slots,
                      disk_bytes=int(args.disk_gb * (1 << 30)), concurrency=args.concurrency,
                      service_s=args.service_s)

    def factory(name: str):  # type: ignore[no-untyped-def]
        def make(nodes: list[SimNode]) -> Policy:
            if name == "quiver":
                return QuiverPolicy(nodes, seed=args.seed, sizes=sizes, ranks=trace.rank_of,
                                    tenants=trace.tenant_of, costs=costs, eviction=EvictionPolicy(args.eviction),
                                    replan_s=args.replan_s,
                                    placement=PlacementConfig(load_bound=args.load_bound,
                                                              replica_util=args.replica_util,
                                                              replica_worth=args.replica_worth,
                                                              miss_cost=args.miss_cost),
                                    routing=RouteConfig(load_bound=args.route_bound))
            return BASELINES[name](nodes, seed=args.seed)
        return make

    results = {name: simulate(trace, fleet, costs, sizes, factory(name), seed=args.seed)
               for name in args.policies.split(",")}
    slots = args.nodes * args.cpu_slots
    counts = sorted(Counter(trace.adapters.tolist()).values(), reverse=True)
    bound = {"cpu_slots_in_fleet": slots, "bound_law": popularity_share(spec, slots),
             "bound_trace": sum(counts[:slots]) / len(trace.adapters)}
    return results, bound


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.replay:
        from devtools.simulate.replay import compare

        print("\n".join(compare(args.replay, defer=not args.replay_at_arrival)))
        return 0
    results, bound = run(args)
    if args.json:
        print(json.dumps({"policies": {k: v.figures for k, v in results.items()},
                          "meta": {**bound, "wall_s": {k: round(v.wall_s, 2) for k, v in results.items()},
                                   "cpu_s": {k: round(v.cpu_s, 2) for k, v in results.items()}}}))
        return 0
    print(f"bound (top-{bound['cpu_slots_in_fleet']} share): law {bound['bound_law']:.1%}, "
          f"this trace {bound['bound_trace']:.1%}")
    head = ["policy", "gpu", "cpu", "disk", "cold", "no-load/bound", "loads/1k", "s3/1k", "GiB moved",
            "added p50 ms", "added p99 ms", "imbalance", "work imb.", "wall s", "cpu s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, r in results.items():
        f = r.figures
        row = [name, *(f"{f[k]:.1%}" for k in METRICS[:4]),
               f"{(f['served_gpu'] + f['served_cpu']) / bound['bound_trace']:.1%}",
               f"{f['loads_per_1k']:.1f}", f"{f['s3_fetches_per_1k']:.1f}", f"{f['bytes_moved'] / (1 << 30):.0f}",
               f"{f['added_ms_p50']:.0f}", f"{f['added_ms_p99']:.0f}", f"{f['load_imbalance']:.3f}", f"{f['work_imbalance']:.3f}",
               f"{r.wall_s:.1f}", f"{r.cpu_s:.1f}"]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
