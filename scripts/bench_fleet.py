"""Benchmark Quiver's residency-affinity routing against round-robin on two real CPU vLLM nodes (issue 6).

Two CPU vLLM nodes (the tiny demo model, ``max_loras`` 2, ``max_cpu_loras`` 4), their agents, the internal
listener, a Celery worker and beat (the reconcile loop re-plans replicas from request rates every 30 s, as in
production) and two gateway processes on the same fleet: one routes with Quiver's policy
(``QUIVER_ROUTING_POLICY=affinity``, ``inference.policy.routing.route``), the other round-robin over every live node
of the base model (``round_robin``, ``inference.policy.routing.route_round_robin``), loading the adapter on demand
where the turn falls, as a round-robin load balancer in front of on-demand-loading engines does.

The default regime is issue 6's: 16 adapters (random PEFT, r 8 on q,v) against 2 nodes × 4 CPU slots, twice the
fleet's CPU caches. Each adapter is warmed once, where production puts it (``placement_on_ready``: the live node with
the fewest residents); past the slots, agents evict by policy to the node's disk (tier ``staged``). Affinity keeps
each adapter on its node, so a node's 4 slots serve its share of the hot set; round-robin sends every adapter to
both nodes, 16 names through 4 slots per node, and each miss is a control-plane warm (Celery task → agent →
``add_lora``; the effect probe runs only on a node's first load of the weights). ``--adapters 8`` is the regime
that fits the fleet but not one node: there affinity serves every request without an engine load.

One seeded Zipf trace (``--zipf`` α over the adapters, ``--requests`` streamed completions of ``--max-tokens``
tokens, ``--concurrency`` clients in a closed loop) is replayed through each gateway in turn, ``--rounds`` times
alternating, so machine noise hits both; before each, ``--warmup`` unmeasured requests let the policy settle the
caches the other one left. Before the first round both gateways replay the warm-up in turn for ``--settle-s``
(40 s): the figures are the steady state, after the reconciler has planned from request rates once (its first plan
is made at upload, without any; a first affinity round measured from there ran at half its later rounds' rate).

Each policy runs with its own eviction on the same nodes, set on every agent (and through it in the engines' workers)
before each of its replays: Quiver's (``--eviction``, LFU by default) for affinity, vLLM's own LRU for round-robin
(``--baseline-eviction``, as in front of stock engines; ``same`` compares routing alone).

Printed side by side per policy: throughput (requests/s, tokens/s), TTFT p50/p99 (first streamed token, ms), the
engines' own load counts (``disk→cpu`` = adapters read into the CPU cache, ``cpu→gpu`` = moved into a GPU slot,
counted in each engine's worker by ``inference.node.worker_ext``), per node, the engines' seconds inside those
moves, each node's mean running and LoRA-deferred requests (waiting because their adapter is not among the batch's
``max_loras``; from the gauges the agents publish every 100 ms), and the ratios. A third replay per
round (off with ``--no-ceiling``) sends the same trace for the base model alone through the affinity gateway: no LoRA
load and no ``max_loras`` limit, the most these engines serve at this concurrency; each policy's throughput is also
printed as a share of it (a 1.5x ratio needs round-robin at two thirds of affinity's share or less). A fourth sends
it for the trace's hottest adapter alone: the cost of LoRA compute itself, with no load after the first and one
adapter per batch.
Target (issue 6): affinity ≥ 1.5× round-robin throughput and a lower p99 TTFT.

Usage:
    ./scripts/bench_fleet [--adapters 16] [--requests 120] [--zipf 1.0] [--concurrency 8] [--rounds 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_fleet_trace import engine_loads, record  # noqa: E402
from scaleout import Processes, fresh_bucket, fresh_database, manage, redis_db, say  # noqa: E402

from demo.api_client import upload_adapter, wait_validated  # noqa: E402
from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import node_process_env  # noqa: E402
from demo.tiny_model import make_random_adapter  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from devtools.services import backing_services  # noqa: E402
from inference.node.launch import EngineConfig, engine_argv, engine_env  # noqa: E402
from workers import schedule  # noqa: E402

PY = sys.executable
REDIS_DB = 12
POLICIES = ("affinity", "round_robin")
CEILING = "no_adapters"  # the same trace for the base model through the affinity gateway: the fleet's ceiling
ONE_ADAPTER = "one_adapter"  # the same trace for its hottest adapter alone: LoRA compute without loads or slot limits
CPU_SLOTS = 4  # max_cpu_loras per node (issue 6's setting)


def zipf_trace(names: list[str], n: int, alpha: float, seed: int) -> list[str]:
    """``n`` adapter names drawn with P(rank k) ∝ 1/k^α (rank 1 = ``names[0]``), seeded."""
    rng = random.Random(seed)
    weights = [1 / (k ** alpha) for k in range(1, len(names) + 1)]
    return rng.choices(names, weights=weights, k=n)


@dataclass
class Run:
    """One replay of the trace through one gateway."""

    policy: str
    seconds: float
    ttft_ms: list[float]
    tokens: int
    errors: list[str]
    loads: dict[str, dict[str, float]]  # node -> {"disk_to_cpu", "cpu_to_gpu", "requests", "load_s", "running_s",
    # "deferred_s"} during the run


def _stream(http: httpx.Client, url: str, body: dict[str, Any], ids: list[str] | None = None) -> tuple[float, int]:
    """One streamed completion: (TTFT ms, completion tokens); with ``ids``, appends the answer's ``id`` (vLLM's
    ``cmpl-<X-Request-Id>``, the id the gateway's route log names the request by). Raises RuntimeError on a non-200
    answer."""
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    with http.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code} {resp.read()[:200]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if ids is not None and not ids and chunk.get("id"):
                ids.append(str(chunk["id"]))
            if chunk.get("choices") and ttft is None:
                ttft = (time.perf_counter() - t0) * 1000
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens") or 0)
    if ttft is None:
        raise RuntimeError("no token streamed")
    return ttft, tokens


def _sample_queues(redis_url: str, nodes: list[str], stop: threading.Event, out: dict[str, dict[str, float]],
                   every_s: float = 0.1) -> None:
    """Until ``stop``, read each node's published engine gauges (``inference.node.load_publisher``, refreshed every
    100 ms) and integrate them over time into ``out[node]``: ``running_s`` and ``deferred_s`` (request-seconds in
    the engine's batch, and waiting because their adapter did not fit the batch's ``max_loras``)."""
    import redis

    from inference.node.load_publisher import load_decode, load_key

    client = redis.Redis.from_url(redis_url)
    last = time.perf_counter()
    try:
        while not stop.wait(every_s):
            now = time.perf_counter()
            for node, raw in zip(nodes, client.mget([load_key(n) for n in nodes]), strict=True):
                load = load_decode(raw)
                if load is not None:
                    out[node]["running_s"] += load.num_requests_running * (now - last)
                    out[node]["deferred_s"] += (load.waiting_deferred or 0) * (now - last)
            last = now
    finally:
        client.close()


def replay(policy: str, url: str, api_key: str, trace: list[str], *, concurrency: int, max_tokens: int,
           engines: dict[str, tuple[str, str]], redis_url: str | None = None,
           sent: list[dict[str, Any]] | None = None) -> Run:
    """Send ``trace`` in order from ``concurrency`` closed-loop clients through the gateway at ``url``; with
    ``redis_url``, also integrate each node's running and LoRA-deferred requests over the replay; with ``sent``,
    append each request's ``{"i", "adapter", "sent_s", "done_s", "ok"}`` (seconds from the replay's start)."""
    lock = threading.Lock()
    queue = iter(enumerate(trace))
    ttfts: list[float] = []
    errors: list[str] = []
    tokens = 0
    start = [time.perf_counter()]

    def client() -> None:
        nonlocal tokens
        with httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=300) as http:
            while True:
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                i, model = item
                body = {"model": model, "prompt": f"the cat {i % 7} sat on", "max_tokens": max_tokens,
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                sent_s = time.perf_counter() - start[0]
                ids: list[str] = []
                try:
                    ttft, n = _stream(http, url, body, ids)
                except (RuntimeError, httpx.HTTPError) as exc:
                    ttft, n = None, 0
                    with lock:
                        errors.append(f"{model}: {exc}")
                with lock:
                    if sent is not None:
                        sent.append({"i": i, "adapter": model, "sent_s": sent_s, "done_s": time.perf_counter() - start[0],
                                     "ok": ttft is not None, "id": ids[0] if ids else ""})
                    if ttft is not None:
                        ttfts.append(ttft)
                        tokens += n

    before = engine_loads(engines)
    queues = {n: {"running_s": 0.0, "deferred_s": 0.0} for n in engines}
    stop = threading.Event()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    sampler = threading.Thread(target=_sample_queues, args=(redis_url, list(engines), stop, queues), daemon=True) \
        if redis_url else None
    t0 = start[0] = time.perf_counter()
    if sent is not None:  # the Unix time of the replay's start, to place the gateway's route log on its clock
        sent.append({"start_unix": time.time()})
    for thread in threads + ([sampler] if sampler else []):
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - t0
    stop.set()
    if sampler:
        sampler.join()
    after = engine_loads(engines)
    loads = {n: {**{k: after[n][k] - before[n][k] for k in after[n]}, **queues[n]} for n in after}
    return Run(policy, seconds, ttfts, tokens, errors, loads)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def aggregate(runs: list[Run]) -> dict[str, Any]:
    """Totals over one policy's rounds: requests/s and tokens/s over the summed wall time, TTFT percentiles over
    every request, engine loads summed per node."""
    seconds = sum(r.seconds for r in runs)
    ttft = [t for r in runs for t in r.ttft_ms]
    nodes = sorted({n for r in runs for n in r.loads})
    loads = {n: {k: sum(r.loads[n][k] for r in runs) for k in ("disk_to_cpu", "cpu_to_gpu", "requests", "load_s",
                                                                     "running_s", "deferred_s")}
             for n in nodes}
    return {"requests": len(ttft), "errors": sum(len(r.errors) for r in runs), "seconds": seconds,
            "rps": len(ttft) / seconds, "tokens_per_s": sum(r.tokens for r in runs) / seconds,
            "ttft_ms_p50": _pct(ttft, 0.5), "ttft_ms_p99": _pct(ttft, 0.99),
            "round_rps": [len(r.ttft_ms) / r.seconds for r in runs], "loads": loads,
            "disk_to_cpu": sum(v["disk_to_cpu"] for v in loads.values()),
            "cpu_to_gpu": sum(v["cpu_to_gpu"] for v in loads.values()),
            "load_s": sum(v["load_s"] for v in loads.values())}


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The side-by-side table and the ratios (affinity over round-robin); with a ``no_adapters`` entry, a third
    column and each policy's throughput as a share of it."""
    a, rr = results["affinity"], results["round_robin"]
    ceiling, one = results.get(CEILING), results.get(ONE_ADAPTER)
    columns = [a, rr] + ([ceiling] if ceiling else []) + ([one] if one else [])
    rows = [("requests served (errors)", lambda r: f"{r['requests']} ({r['errors']})"),
            ("throughput, requests/s", lambda r: f"{r['rps']:.2f}"),
            ("throughput, tokens/s", lambda r: f"{r['tokens_per_s']:.1f}"),
            ("  per round, requests/s", lambda r: " ".join(f"{x:.2f}" for x in r["round_rps"])),
            ("TTFT p50, ms", lambda r: f"{r['ttft_ms_p50']:.0f}"),
            ("TTFT p99, ms", lambda r: f"{r['ttft_ms_p99']:.0f}"),
            ("engine loads disk→cpu", lambda r: f"{r['disk_to_cpu']}"),
            ("engine loads cpu→gpu", lambda r: f"{r['cpu_to_gpu']}"),
            ("disk→cpu loads per request", lambda r: f"{r['disk_to_cpu'] / max(1, r['requests']):.2f}"),
            # Moves run inside the engine's step: every running request on that node waits them out.
            ("engine seconds in moves (share)",
             lambda r: f"{r['load_s']:.1f} ({r['load_s'] / max(1e-9, r['seconds'] * max(1, len(r['loads']))):.0%})")]
    for node in sorted({n for r in columns for n in r["loads"]}):
        rows.append((f"  {node} requests, d→c / c→g",
                     lambda r, n=node: f"{r['loads'][n]['requests']}, {r['loads'][n]['disk_to_cpu']} / "
                                       f"{r['loads'][n]['cpu_to_gpu']}" if n in r["loads"] else "-"))
        rows.append((f"  {node} mean running / deferred",
                     lambda r, n=node: f"{r['loads'][n]['running_s'] / r['seconds']:.1f} / "
                                       f"{r['loads'][n]['deferred_s'] / r['seconds']:.1f}" if n in r["loads"] else "-"))
    heads = ["affinity (Quiver)", "round-robin"] + (["base model only"] if ceiling else []) + \
        (["one adapter only"] if one else [])
    lines = [f"{'':32} " + " ".join(f"{h:>20}" for h in heads)]
    lines += [f"{label:32} " + " ".join(f"{fmt(r):>20}" for r in columns) for label, fmt in rows]
    lines.append(f"ratios: throughput {a['rps'] / rr['rps']:.2f}x (target >= 1.5x); TTFT p99 "
                 f"{a['ttft_ms_p99'] / rr['ttft_ms_p99']:.2f}x (target < 1); disk→cpu loads "
                 f"{a['disk_to_cpu'] / max(1, rr['disk_to_cpu']):.2f}x; cpu→gpu loads "
                 f"{a['cpu_to_gpu'] / max(1, rr['cpu_to_gpu']):.2f}x")
    if ceiling:
        lines.append(f"share of the base-model-only throughput (the same trace with no adapter, so no LoRA load and "
                     f"no LoRA batch limit): affinity {a['rps'] / ceiling['rps']:.0%}, round-robin "
                     f"{rr['rps'] / ceiling['rps']:.0%}; affinity's 1.5x needs round-robin at or below "
                     f"{a['rps'] / ceiling['rps'] / 1.5:.0%}")
    if ceiling and one:
        lines.append(f"one adapter only (every request for the trace's hottest adapter: LoRA compute, no load, one "
                     f"slot) runs at {one['rps'] / ceiling['rps']:.0%} of the base model's throughput; affinity at "
                     f"{a['rps'] / one['rps']:.0%} of it, round-robin at {rr['rps'] / one['rps']:.0%}")
    return lines


def _warm_where_placed(env: dict[str, str], names: list[str], timeout_s: float = 600, *,
                       fits: bool = True) -> dict[str, list[str]]:
    """Wait until every ready version of ``names`` is on a node where ``placement_on_ready`` put it (warming on the
    least-resident node any the control plane did not place); returns node -> adapter names.

    ``fits``: the versions fit the fleet's CPU slots, so each must be served (in an engine). Otherwise at most the
    slots' worth can be, and the rest are evicted to the node's disk (tier ``staged``): a staged copy counts."""
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections
    from django.db.models import Q

    from adapters_app.models import AdapterVersion
    from inference.fleet.models import Placement
    from inference.fleet.warming import placement_warm, warm_target_node

    deadline = time.monotonic() + timeout_s
    while True:
        where: dict[str, list[str]] = {}
        missing = []
        for version in AdapterVersion.objects.filter(adapter__name__in=names, status="ready").select_related(
                "adapter__base_model"):
            held = Placement.objects.filter(adapter_version=version)
            held = held.filter(served=True) if fits else held.filter(
                Q(served=True) | Q(tier__in=("staged", "warm", "hot")))
            served = held.select_related("node").order_by("-served").first()
            if served is None:
                missing.append(version)
            else:
                where.setdefault(served.node.name, []).append(version.adapter.name)
        if not missing:
            break
        if time.monotonic() > deadline:
            for version in missing:
                node = warm_target_node(version)
                if node is not None:
                    placement_warm(version, node=node)
            deadline = time.monotonic() + timeout_s
        time.sleep(1)
    connections.close_all()
    return {n: sorted(v) for n, v in sorted(where.items())}


def _plan_summary() -> str:
    """The reconciler's last plan (``inference.fleet.plan``) as "node: adapters"; run after
    ``_warm_where_placed`` set Django up."""
    from django.db import connections

    from adapters_app.models import AdapterVersion
    from inference.fleet.plan import plan_all

    plan = plan_all()
    names = dict(AdapterVersion.objects.filter(pk__in=plan).values_list("pk", "adapter__name"))
    connections.close_all()
    by_node: dict[str, list[str]] = {}
    for version_id, nodes in plan.items():
        for node in nodes:
            by_node.setdefault(node, []).append(names.get(version_id, str(version_id)))
    return "; ".join(f"{n}: {', '.join(sorted(v))}" for n, v in sorted(by_node.items())) or "none yet"


def _set_eviction(agents: dict[str, tuple[str, str]], policy: str) -> None:
    """Set every node's eviction policy (agent and engine: the agent's ``POST /v1/eviction_policy``)."""
    for url, key in agents.values():
        httpx.post(url + "/v1/eviction_policy", json={"policy": policy}, headers={"Authorization": f"Bearer {key}"},
                   timeout=30).raise_for_status()


def _half_of_the_cores(i: int) -> str:
    """Engine ``i`` (1 or 2)'s share of this process's cores, as ``VLLM_CPU_OMP_THREADS_BIND`` wants it ("0", "2,3").

    vLLM's ``auto`` binding pins every engine's OMP threads to the same cores: two engines then fight for each core,
    and an OMP barrier stalls whenever its other thread is descheduled (vllm/utils/ompmultiprocessing.py)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(len(cores) // 2, 1)
    mine = cores[(i - 1) * per: i * per] or cores[-per:]
    return ",".join(str(c) for c in mine)


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear scenario
    """Start the fleet, replay the trace through both gateways, print the table. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=16, help="issue 6 asks for 16 or more")
    parser.add_argument("--requests", type=int, default=120, help="requests in the trace (each round replays it)")
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity skew α")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternating replays per policy (4: one round of either policy moves by up to 30 %% on a 2-core box)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=None,
                        help="unmeasured requests (same popularity, another seed) before each measured round, "
                             "default --requests: both gateways share the engines, so each round starts from the "
                             "other policy's caches, and a policy's first round stages copies on new nodes")
    parser.add_argument("--settle-s", type=float, default=40.0,
                        help="before the first round, replay the warm-up trace through both gateways in turn for at "
                             "least this long (unmeasured), so the reconciler (every 30 s) has planned from request "
                             "rates once: until then its plan is the upload's, made without any; 0 = off")
    parser.add_argument("--miss-cost", type=float, default=1.0,
                        help="QUIVER_PLACEMENT_MISS_COST for the reconciler: on this CPU node a reload costs about one "
                             "16-token request's worth (3 gave the hottest adapters' node 62%% of the requests; 0 is "
                             "the GPU default; docs/placement.md)")
    parser.add_argument("--replica-worth", type=float, default=None,
                        help="QUIVER_PLACEMENT_REPLICA_WORTH for the reconciler (default: the setting's default)")
    parser.add_argument("--route-bound", type=float, default=None,
                        help="QUIVER_ROUTING_LOAD_BOUND for the affinity gateway (default: the setting's default)")
    parser.add_argument("--eviction", choices=("lru", "lfu", "cost"), default="lfu",
                        help="Quiver's eviction policy on the nodes during affinity's replays (QUIVER_EVICTION_POLICY)")
    parser.add_argument("--baseline-eviction", choices=("lru", "lfu", "cost", "same"), default="lru",
                        help="the nodes' eviction policy during round-robin's replays: lru = vLLM's own LRU, as "
                             "round-robin in front of stock vLLM engines; same = --eviction (routing alone compared)")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the third and fourth replays per round: the trace with every request for the base "
                             "model (no LoRA loads, no max_loras limit), the most these engines serve at this "
                             "concurrency, and with every request for its hottest adapter (LoRA compute alone)")
    parser.add_argument("--workdir", type=Path, default=REPO / ".cache" / "bench-fleet")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    parser.add_argument("--trace-out", type=Path, default=None,
                        help="write affinity's first measured replay as JSON lines (scripts/bench_fleet_trace.py), "
                             "for scripts/simulate --replay")
    parser.add_argument("--only-affinity", action="store_true",
                        help="replay through the affinity gateway alone (a recorded run for the simulator)")
    parser.add_argument("--record", default="",
                        help="with --trace-out: after the rounds, more recorded affinity replays on the same fleet, "
                             "'SEED:ZIPF,…' (each its own Zipf trace, written beside --trace-out as STEM-sSEED-zZIPF)")
    parser.add_argument("--engine-cores", choices=("split", "shared"), default="split",
                        help="split: each engine's OMP threads bound to its own half of the cores, as two nodes each "
                             "with its own accelerator; shared: both bound to every core (vLLM's auto binding)")
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = args.requests

    assets = ensure_demo_assets()
    (args.workdir / "logs").mkdir(parents=True, exist_ok=True)
    for old in args.workdir.glob("cache-*"):  # a fresh database each run: the nodes' disks start fresh too
        shutil.rmtree(old, ignore_errors=True)
    names = [f"bench-{i:02d}" for i in range(args.adapters)]
    folders = {n: make_random_adapter(assets.base_dir, args.workdir / "adapters" / n, r=8, lora_alpha=16,
                                      target_modules=["q_proj", "v_proj"], seed=100 + i)
               for i, n in enumerate(names)}
    procs = Processes(args.workdir / "logs")
    with ExitStack() as stack:
        env = {**os.environ}
        env.update(stack.enter_context(backing_services(env)))
        stack.callback(procs.stop_all)
        env["DATABASE_URL"] = stack.enter_context(fresh_database(env["DATABASE_URL"]))
        env["AWS_STORAGE_BUCKET_NAME"] = stack.enter_context(fresh_bucket(env))
        env["REDIS_URL"] = env["CELERY_BROKER_URL"] = redis_db(env["REDIS_URL"], REDIS_DB)
        env.update({"DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false",
                    "DJANGO_LOG_LEVEL": "WARNING", "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
                    "QUIVER_API_KEY_HMAC_KEY": secrets.token_urlsafe(48),
                    "QUIVER_NODE_SECRET": secrets.token_urlsafe(48), "QUIVER_WARM_WAIT_S": "120",
                    "QUIVER_PLACEMENT_MISS_COST": str(args.miss_cost)})
        if args.replica_worth is not None:
            env["QUIVER_PLACEMENT_REPLICA_WORTH"] = str(args.replica_worth)
        say("migrating a fresh database, registering the tiny base model and a tenant")
        manage(env, "migrate", "--noinput")
        manage(env, "quiver_base_model_register", assets.served_name, str(assets.base_dir), "--max-lora-rank", "16")
        api_key = manage(env, "quiver_tenant_create", "bench", "--name", "Bench").splitlines()[-1]
        urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("internal", *POLICIES)}
        procs.start("internal", [PY, "-m", "uvicorn", "config.internal_asgi:application", "--host", "127.0.0.1",
                                 "--port", urls["internal"].rsplit(":", 1)[1], "--log-level", "warning"], env)
        for policy in POLICIES:
            procs.start(policy, [PY, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                                 urls[policy].rsplit(":", 1)[1], "--log-level", "warning", "--no-access-log"],
                        {**env, "QUIVER_ROUTING_POLICY": policy,
                         # Each request's routing decision in the gateway's log, for the recorded traces.
                         **({"QUIVER_GATEWAY_ROUTE_LOG": "INFO"} if args.trace_out and policy == "affinity" else {}),
                         **({"QUIVER_ROUTING_LOAD_BOUND": str(args.route_bound)} if args.route_bound else {})})
        procs.start("worker", [PY, "-m", "celery", "-A", "config", "worker", "--pool=threads", "--concurrency=4",
                               "-Q", ",".join(schedule.ALL_QUEUES), "-n", "bench@%h", "--loglevel=WARNING"], env)
        # Beat as in production: the usage drain gives the reconcile loop its request rates, and every 30 s it
        # re-plans replicas from them (hot adapters on more nodes, inference.policy.placement.place).
        procs.start("beat", [PY, "-m", "celery", "-A", "config", "beat", "--loglevel=WARNING",
                             "-s", str(args.workdir / "celerybeat-schedule")], env)
        engines: dict[str, tuple[str, str]] = {}
        agents: dict[str, tuple[str, str]] = {}
        eviction = {"affinity": args.eviction,
                    "round_robin": args.eviction if args.baseline_eviction == "same" else args.baseline_eviction}
        for i in (1, 2):
            node, agent_url, engine_port = f"node-{i}", f"http://127.0.0.1:{free_port()}", free_port()
            creds = dict(line.split("=", 1) for line in manage(
                env, "quiver_node_register", node, "--agent-url", agent_url, "--engine-url",
                f"http://127.0.0.1:{engine_port}", "--base-model", assets.served_name).splitlines() if "=" in line)
            engine = EngineConfig.cpu_dev(assets.base_dir, assets.served_name, port=engine_port,
                                          api_key=creds["QUIVER_NODE_KEY"])
            engines[node] = (engine.url, creds["QUIVER_NODE_KEY"])
            agents[node] = (agent_url, creds["QUIVER_NODE_KEY"])
            node_env = node_process_env(env)
            engine_vars = engine_env(engine, node_env)
            if args.engine_cores == "split":
                engine_vars["VLLM_CPU_OMP_THREADS_BIND"] = _half_of_the_cores(i)
            procs.start(f"engine-{i}", engine_argv(engine, python=PY), engine_vars)
            procs.start(f"agent-{i}", [PY, "-m", "uvicorn", "inference.node.agent:app", "--host", "127.0.0.1",
                                       "--port", agent_url.rsplit(":", 1)[1], "--log-level", "warning"], {
                **node_env, **creds, "QUIVER_ENGINE_URL": engine.url, "QUIVER_BASE_MODEL": assets.served_name,
                "QUIVER_NODE_CACHE_DIR": str(args.workdir / f"cache-{i}"), "QUIVER_AGENT_URL": agent_url,
                "QUIVER_CONTROL_URL": urls["internal"], "QUIVER_HEARTBEAT_SECONDS": "1",
                "QUIVER_MAX_LORAS": "2", "QUIVER_MAX_CPU_LORAS": str(CPU_SLOTS), "QUIVER_MAX_LORA_RANK": "16"})
        for name in ("internal", *POLICIES):
            procs.wait_http(name, urls[name] + "/healthz", 120)
        for i, (url, _) in enumerate(engines.values(), start=1):
            procs.wait_http(f"engine-{i}", url + "/health", 900)
        api = stack.enter_context(httpx.Client(base_url=urls["affinity"], timeout=300,
                                               headers={"Authorization": f"Bearer {api_key}"}))
        say(f"engines up; uploading {len(names)} adapters")
        numbers = {n: upload_adapter(api, n, folders[n], base_model=assets.served_name)["number"] for n in names}
        for n in names:
            if wait_validated(api, n, numbers[n], timeout=600)["status"] != "ready":
                raise SystemExit(f"{n} was rejected")
        deadline = time.monotonic() + 120
        probe = {"model": assets.served_name, "prompt": "x", "max_tokens": 1}
        while any(api.post(urls[p] + "/v1/completions", json=probe).status_code != 200 for p in POLICIES):
            if time.monotonic() > deadline:
                raise SystemExit("the gateways never saw a live node")
            time.sleep(1)
        say("waiting until every adapter is served where the control plane placed it")
        placed = _warm_where_placed(env, names, timeout_s=60, fits=len(names) <= 2 * CPU_SLOTS)
        say("placement: " + "; ".join(f"{n}: {', '.join(v)}" for n, v in placed.items()))
        time.sleep(3)  # a heartbeat from each node, and each gateway's fleet view refreshed
        trace = zipf_trace(names, args.requests, args.zipf, args.seed)
        top = sorted(((trace.count(n), n) for n in names), reverse=True)[:4]
        say(f"trace: {len(trace)} requests over {len(set(trace))} adapters (top 4: "
            f"{', '.join(f'{n} {c}' for c, n in top)}); {args.rounds} rounds per policy, alternating")
        warmup = zipf_trace(names, args.warmup, args.zipf, args.seed + 1000) if args.warmup else []
        runs: dict[str, list[Run]] = {p: [] for p in POLICIES}
        settle_until = time.monotonic() + args.settle_s
        while warmup and time.monotonic() < settle_until:  # unmeasured, both policies in turn
            for policy in POLICIES:
                _set_eviction(agents, eviction[policy])
                replay(policy, urls[policy], api_key, warmup, concurrency=args.concurrency,
                       max_tokens=args.max_tokens, engines=engines)
        if args.settle_s:
            say(f"settled for {args.settle_s:g} s; reconciler's plan: {_plan_summary()}")
        policies = ("affinity",) if args.only_affinity else POLICIES
        header = {"nodes": sorted(engines), "max_loras": 2, "max_cpu_loras": CPU_SLOTS, "eviction": args.eviction,
                  "concurrency": args.concurrency, "max_tokens": args.max_tokens, "max_num_seqs": engine.max_num_seqs,
                  "miss_cost": args.miss_cost, "replica_worth": args.replica_worth}
        route_log = procs.log_dir / "affinity.log"
        for round_no in range(args.rounds):
            for policy in (policies if round_no % 2 == 0 else policies[::-1]):
                _set_eviction(agents, eviction[policy])
                if warmup:
                    replay(policy, urls[policy], api_key, warmup, concurrency=args.concurrency,
                           max_tokens=args.max_tokens, engines=engines)
                say(f"reconciler's plan: {_plan_summary()}")
                def send(sent: list[dict[str, Any]] | None = None, policy: str = policy) -> Run:
                    return replay(policy, urls[policy], api_key, trace, concurrency=args.concurrency,
                                  max_tokens=args.max_tokens, engines=engines, redis_url=env["REDIS_URL"], sent=sent)

                if args.trace_out is not None and policy == "affinity" and not runs["affinity"]:
                    run = record(args.trace_out, engines=engines, names=names, send=send, route_log=route_log,
                                 header={**header, "zipf": args.zipf, "seed": args.seed})
                    say(f"trace written to {args.trace_out}")
                else:
                    run = send()
                runs[policy].append(run)
                say(f"round {round_no + 1} {policy}: {len(run.ttft_ms)} ok, {len(run.errors)} errors, "
                    f"{run.seconds:.1f} s; loads {json.dumps({n: {k: round(v, 2) for k, v in d.items()} for n, d in run.loads.items()})}"
                    + (f"; first error: {run.errors[0]}" if run.errors else ""))
            if not args.no_ceiling:
                run = replay(CEILING, urls["affinity"], api_key, [assets.served_name] * len(trace),
                             concurrency=args.concurrency, max_tokens=args.max_tokens, engines=engines,
                             redis_url=env["REDIS_URL"])
                runs.setdefault(CEILING, []).append(run)
                say(f"round {round_no + 1} base model only: {len(run.ttft_ms)} ok, {run.seconds:.1f} s")
                hottest = max(names, key=trace.count)
                run = replay(ONE_ADAPTER, urls["affinity"], api_key, [hottest] * len(trace),
                             concurrency=args.concurrency, max_tokens=args.max_tokens, engines=engines,
                             redis_url=env["REDIS_URL"])
                runs.setdefault(ONE_ADAPTER, []).append(run)
                say(f"round {round_no + 1} {hottest} only: {len(run.ttft_ms)} ok, {run.seconds:.1f} s")
        for spec in filter(None, args.record.split(",")) if args.trace_out is not None else ():
            seed, zipf = int(spec.split(":")[0]), float(spec.split(":")[1])
            extra, out = zipf_trace(names, args.requests, zipf, seed), args.trace_out.with_name(
                f"{args.trace_out.stem}-s{seed}-z{zipf:g}.jsonl")
            _set_eviction(agents, eviction["affinity"])
            run = record(out, engines=engines, names=names, header={**header, "zipf": zipf, "seed": seed},
                         route_log=route_log,
                         send=lambda sent, extra=extra: replay("affinity", urls["affinity"], api_key, extra,
                                                               concurrency=args.concurrency,
                                                               max_tokens=args.max_tokens, engines=engines,
                                                               sent=sent))
            say(f"recorded {out}: {len(run.ttft_ms)} ok, {len(run.errors)} errors, {run.seconds:.1f} s")
        results = {p: aggregate(r) for p, r in runs.items() if r}
        # Printed before teardown: a failing cleanup must not lose the figures.
        load1, load5, _ = os.getloadavg()
        print(f"\nbench_fleet: 2 CPU vLLM nodes (max_loras 2, max_cpu_loras 4), {args.adapters} adapters, Zipf α "
              f"{args.zipf}, {args.requests} requests x {args.rounds} rounds per policy (after {args.warmup} unmeasured), concurrency "
              f"{args.concurrency}, {args.max_tokens} tokens each; engine cores {args.engine_cores}; placement miss cost "
              f"{args.miss_cost:g}, replica worth {env.get('QUIVER_PLACEMENT_REPLICA_WORTH', 'default')}; eviction affinity {eviction['affinity']}, round-robin {eviction['round_robin']}; "
              f"cores {os.cpu_count()}, "
              f"load avg {load1:.1f}/{load5:.1f}")
        a = results["affinity"]
        print("\n".join(table(results)) if "round_robin" in results else f"affinity: {a['requests']} requests, "
              f"{a['rps']:.2f} req/s, disk→cpu loads {a['disk_to_cpu'] / max(a['requests'], 1):.3f} per request")
        if args.json:
            print(json.dumps({"policies": results}))

    return 0 if all(r["errors"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
