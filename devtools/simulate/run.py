"""The event loop: replay a trace against one policy and measure it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from devtools.simulate.costs import CostModel
from devtools.simulate.fleet import FleetSpec, SimNode
from devtools.simulate.policies import Policy
from devtools.simulate.workload import Trace
from inference.policy.tiers import IN_ENGINE, Tier

METRICS = ("served_gpu", "served_cpu", "served_disk", "served_cold", "loads_per_1k", "s3_fetches_per_1k",
           "bytes_moved", "added_ms_p50", "added_ms_p99", "load_imbalance")
# Beyond the list: the busiest node's request-seconds (wait + service) over the mean.
EXTRA = ("work_imbalance",)


@dataclass(frozen=True)
class Result:
    """One policy's figures (``METRICS``) plus the run's wall and CPU time in seconds."""

    figures: dict[str, float]
    wall_s: float
    cpu_s: float


def simulate(trace: Trace, fleet: FleetSpec, costs: CostModel, sizes: Sequence[int],
             make_policy: Callable[[list[SimNode]], Policy], *, seed: int, service_s: Sequence[float] | None = None,
             prepare: Callable[[list[SimNode], Policy], None] | None = None,
             node_names: Sequence[str] | None = None, choices: list[tuple[str, Tier, bool]] | None = None) -> Result:
    """Replay ``trace`` on a fresh fleet under the policy ``make_policy`` builds.

    A request is classified by where its adapter was on the chosen node when it arrived (a request that finds a load
    of its adapter in progress there waits for it and counts in that load's tier, without a second load). A request's
    added latency is the time until its adapter is in a GPU slot; loads of different adapters overlap (queueing
    behind one another would only widen the gaps between policies).

    ``service_s`` gives each request's time on its node (a recorded run's, ``devtools.simulate.replay``) instead of
    the exponential draw; ``prepare`` sets the nodes' and the policy's state before the first request;
    ``node_names`` names the nodes (``node-0``… by default: names are HRW keys, so a replay uses the recorded ones);
    ``choices`` gets, per request, the node that served it, the tier its adapter was in there when it arrived, and
    whether the engine found it in its CPU cache when it first scheduled the request (as the engines count
    ``served``): on arrival, or after a wait for the batch (``FleetSpec.defer``); a request the control plane
    warmed its adapter for (``Policy.warmed``) finds it there.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    names = list(node_names) if node_names is not None else [f"node-{i}" for i in range(fleet.nodes)]
    nodes = [SimNode(name, fleet) for name in names]
    policy = make_policy(nodes)
    if prepare is not None:
        prepare(nodes, policy)
    rng = np.random.default_rng(seed + 7)
    service = (list(service_s) if service_s is not None
               else rng.exponential(fleet.service_s, len(trace.adapters)).tolist())
    times = trace.times.tolist()
    wanted = trace.adapters.tolist()
    swap_ms = costs.cpu_to_gpu_ms()
    slot_bytes = costs.slot_bytes()
    served = {Tier.GPU: 0, Tier.CPU: 0, Tier.DISK: 0, Tier.COLD: 0}
    loads = fetches = moved = 0
    added = np.empty(len(times), dtype=np.float64)
    work = {n.name: 0.0 for n in nodes}
    def engine_load(node: SimNode, a: int, t: float) -> None:
        # A read into the engine's CPU cache (from S3 first when the node's disk lacks it), room by the policy.
        nonlocal fetches, loads, moved
        size = sizes[a]
        if a not in node.disk:
            fetches += 1
            moved += size
            for victim in policy.disk_victim(node, size, t):
                node.disk_used -= node.disk.pop(victim)
            node.disk[a] = size
            node.disk_used += size
        loads += 1
        moved += size
        if len(node.engine.cpu) >= node.engine.max_cpu_loras:
            policy.make_room(node, a, t)
        policy.loaded(node, a, t)
        node.engine.activate(a)

    resident: list[bool] = []
    picked: list[tuple[str, Tier]] = []

    def admit(node: SimNode, adapter: int, waiting: list[int], at: float) -> None:
        # Deferred requests the batch now runs: the engine schedules them, reading the adapter back first if it
        # left the CPU cache while they waited.
        found = adapter in node.engine.cpu
        if not found:
            engine_load(node, adapter, at)
        for j in waiting:
            resident[j] = found

    admits = {n.name: partial(admit, n) for n in nodes} if fleet.defer else {}
    for i, (t, a) in enumerate(zip(times, wanted, strict=True)):
        for n in nodes:
            n.advance(t, admits.get(n.name))
        policy.tick(t)
        node = policy.choose(a, t)
        pending = node.pending.get(a)
        if not node.runs_now(a):
            # Waits for the batch (FleetSpec.defer): no load now unless the control plane warmed it for this request.
            tier = node.tier(a)
            if policy.warmed and tier not in IN_ENGINE:
                engine_load(node, a, t)
            node.deferred.setdefault(a, []).append(i)
            ready = t
        elif pending is not None and pending[0] > t:
            tier, ready = pending[1], pending[0]
        else:
            tier = node.tier(a)
            cost_ms = 0.0
            size = sizes[a]
            if tier is Tier.COLD:
                fetches += 1
                cost_ms += costs.s3_to_disk_ms(size)
                moved += size
                for victim in policy.disk_victim(node, size, t):
                    node.disk_used -= node.disk.pop(victim)
                node.disk[a] = size
                node.disk_used += size
            elif a in node.disk:
                node.disk.move_to_end(a)
            if tier is Tier.COLD or tier is Tier.DISK:
                loads += 1
                cost_ms += costs.disk_to_cpu_ms(size)
                moved += size
                if len(node.engine.cpu) >= node.engine.max_cpu_loras:
                    policy.make_room(node, a, t)
                policy.loaded(node, a, t)
            if tier is not Tier.GPU:
                cost_ms += swap_ms
                moved += slot_bytes
            node.engine.activate(a)
            if cost_ms:
                ready = t + cost_ms / 1000.0
                node.pending[a] = (ready, tier)
            else:
                ready = t
        served[tier] += 1
        resident.append(policy.warmed or tier in IN_ENGINE)
        picked.append((node.name, tier))
        added[i] = (ready - t) * 1000.0
        node.served += 1
        work[node.name] += ready - t + service[i]
        node.start(a, ready + service[i])
        policy.served(node, a, t)
    total = len(times)
    if choices is not None:  # resident: where each request's adapter was when the engine first scheduled it
        choices.extend((name, tier, found) for (name, tier), found in zip(picked, resident, strict=True))
    loads += policy.extra_loads
    fetches += policy.extra_fetches
    moved += policy.extra_bytes
    per_node = [n.served for n in nodes]
    figures = {
        "served_gpu": served[Tier.GPU] / total,
        "served_cpu": served[Tier.CPU] / total,
        "served_disk": served[Tier.DISK] / total,
        "served_cold": served[Tier.COLD] / total,
        "loads_per_1k": 1000.0 * loads / total,
        "s3_fetches_per_1k": 1000.0 * fetches / total,
        "bytes_moved": float(moved),
        "added_ms_p50": float(np.percentile(added, 50)),
        "added_ms_p99": float(np.percentile(added, 99)),
        "load_imbalance": max(per_node) / (sum(per_node) / len(per_node)),
        "work_imbalance": max(work.values()) / (sum(work.values()) / len(work)),
    }
    return Result(figures, time.perf_counter() - started, time.process_time() - cpu_started)
