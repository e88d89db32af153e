"""The fleet at scale (issue 31): the real control plane on N emulated nodes, measured against its SLOs.

Usage:
    ./scripts/fleet_scale [--nodes 16] [--adapters 200] [--tenants 20] [--rate 10] [--duration 60] [--seed 1]
                          [--gateways 2] [--usage-rows 0] [--usage-days 365] [--json]

Real: PostgreSQL, Redis and SeaweedFS (``devtools.services``; a fresh database, Redis db and bucket of the run's
own), the web process (``config.asgi``), ``--listeners`` internal listeners (heartbeats; 2, as the Kubernetes base
runs), ``--gateways`` gateway processes
(``config.asgi`` under uvicorn), Celery workers (placement, validation) and beat, and one real node agent per node (staging the adapters'
files from S3 and checking their sha256), registered with ``manage.py quiver_node_register``. Emulated: each node's
vLLM engine (``devtools.hollow``: vLLM's routes, its two LoRA LRUs and a step-cost clock, ``--calibration``
``h100-8b`` by default). Agents and engines share ``host`` processes of ``--nodes-per-host`` nodes each, run at
``--host-nice`` (10): on a fleet each node is its own machine, so on this one their CPU yields to the control plane's
(``--host-nice 0`` to make them compete). Tenants
(``manage.py quiver_tenant_create``) upload small real PEFT adapters (``devtools.hollow.adapters``) through the
public API, validated by the worker. Then the trace of ``devtools.simulate.workload`` (Poisson at ``--rate``, Zipf
popularity; ``--cv``, ``--on-off`` and ``--drift`` for bursty tenants and popularity drift) is replayed open-loop
through the gateways, and the simulator replays the same trace with the emulator's cost model.

The gateways, the internal listener and the worker run with timing probes (``devtools.hollow.probes``,
``probe_tasks``); every ``--evict-every-s`` an operator evicts a served adapter from a node and the gateways'
refreshes time when they stop routing it there (``propagation_ms``). ``--usage-rows N`` seeds N usage records for
the first tenant (the one whose pages are timed) over ``--usage-days`` ending now, once its adapters are uploaded
(``manage.py quiver_seed_usage``; 10 million take about 10 minutes here), so ``api_ms_p99`` is measured at a year
of a busy tenant's traffic rather than over the run's own rows. Printed: the table of issue 31's keys with
their targets (``--json``: one object).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import secrets
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from scaleout import Processes, fresh_bucket, fresh_database, manage, redis_db  # noqa: E402

from demo.api_client import upload_adapter  # noqa: E402
from demo.assets import ensure_demo_assets  # noqa: E402
from devtools.hollow import figures  # noqa: E402
from devtools.hollow.adapters import adapter_name, make_adapters, tenant_slug  # noqa: E402
from devtools.hollow.costs import calibration  # noqa: E402
from devtools.hollow.replay import PageTimer, Sampler, operator_client, replay, tree_rss_bytes  # noqa: E402
from devtools.proc import autogroup_nice, free_port, free_port_outside_ephemeral  # noqa: E402
from devtools.services import backing_services  # noqa: E402
from devtools.simulate.workload import WorkloadSpec, generate  # noqa: E402
from workers import schedule  # noqa: E402

PY = sys.executable
REDIS_DB = 12


def say(msg: str) -> None:
    """One timestamped progress line on stderr (stdout is the table or the JSON)."""
    print(f"[fleet_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--adapters", type=int, default=200)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--rate", type=float, default=10.0, help="requests per second (mean)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gateways", type=int, default=2)
    p.add_argument("--listeners", type=int, default=2,
                   help="internal heartbeat listener processes (platform/k8s/base/web-internal.yaml runs 2 replicas)")
    p.add_argument("--host-nice", type=int, default=10,
                   help="nice of the emulated nodes' host processes (0: compete with the control plane for CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of the gaps (1 = Poisson)")
    p.add_argument("--on-off", type=float, default=0.0, help="share of bursty (on/off) tenants")
    p.add_argument("--drift", type=float, default=0.0, help="share of adapters whose popularity moves per epoch")
    p.add_argument("--gpu-slots", type=int, default=4)
    p.add_argument("--cpu-slots", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--calibration", default="h100-8b", choices=("h100-8b", "cpu-tiny"))
    p.add_argument("--nodes-per-host", type=int, default=16)
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="QUIVER_HEARTBEAT_SECONDS (production default)")
    p.add_argument("--load-publish-ms", type=float, default=100.0, help="QUIVER_LOAD_PUBLISH_MS (default 100)")
    p.add_argument("--evict-every-s", type=float, default=10.0)
    p.add_argument("--usage-rows", type=int, default=0,
                   help="usage records seeded for the first tenant over --usage-days before the replay (0: none)")
    p.add_argument("--usage-days", type=float, default=365.0)
    p.add_argument("--workdir", type=Path, default=REPO / ".cache" / "fleet-scale")
    p.add_argument("--record", type=Path, default=None,
                   help="write the run's per-request record here (JSON: the trace, the engines' events, the operator's "
                        "evictions, node names and version ids) for devtools.hollow.compare")
    return p.parse_args(argv)


def call(command: str, *args: str, **env: str) -> str:
    """A ``manage.py`` command run in this process (Django is set up); its stdout."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        call_command(command, *args, stdout=out)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out.getvalue().strip()


def wait_until(what: str, done: Any, timeout: float, every: float = 1.0) -> None:
    """Poll ``done()`` until true; raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done within {timeout:.0f} s")
        time.sleep(every)


def start_control_plane(procs: Processes, env: dict[str, str], gateways: int, listeners: int) -> dict[str, str]:
    """Web, internal listeners (``web-internal-<i>``), gateways, worker and beat; returns name → URL of the HTTP
    ones."""
    urls = {}
    apps = {"web": "config.asgi:application",
            **{f"web-internal-{i}": "devtools.hollow.probes:internal_application" for i in range(1, listeners + 1)},
            **{f"gateway-{i}": "devtools.hollow.probes:gateway_application" for i in range(1, gateways + 1)}}
    for name, app in apps.items():
        port = free_port()
        urls[name] = f"http://127.0.0.1:{port}"
        procs.start(name, [PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level",
                           "warning", "--no-access-log"], env)
    # As docker-compose.yml runs them, each on Celery's prefork pool: placement (and beat's default queue) with 16
    # children, since its warms wait on node agents for their whole load (8 spent 70 % of a 64-node run waiting,
    # and an operator's evict queued behind them for 16.5 s p99; 32 threads instead let one CPU-heavy housekeeping
    # task hold the GIL the warms need); validation; the reconcile pass with one long-lived child whose HRW memo
    # stays warm (workers.schedule).
    for name, queues, pool, children in (("worker", "celery,placement", "prefork", 16),
                                         ("worker-validation", "validation", "prefork", 2),
                                         ("worker-reconcile", schedule.RECONCILE_QUEUE, "prefork", 1)):
        procs.start(name, [PY, "-m", "celery", "-A", "config", "worker", f"--pool={pool}", f"--concurrency={children}",
                           "-Q", queues,
                           "-n", f"{name}@%h", "--loglevel=WARNING", "--include", "devtools.hollow.probe_tasks"], env)
    procs.start("beat", [PY, "-m", "celery", "-A", "config", "beat", "--loglevel=WARNING", "-s",
                         str(Path(env["QUIVER_HOLLOW_PROBE_DIR"]).parent / "beat-schedule")], env)
    return urls


def start_nodes(procs: Processes, env: dict[str, str], args: argparse.Namespace, served: str, internal: list[str],
                workdir: Path) -> dict[str, dict[str, Any]]:
    """Register ``--nodes`` nodes and start their hosts; returns name → node spec.

    Node ``i`` heartbeats to ``internal[i % len(internal)]`` (a Service spreads the agents' connections over the
    listener replicas the same way). The hosts run under ``nice --host-nice``: they stand in for the nodes' own
    machines, whose CPU does not queue the control plane's on a real fleet."""
    nodes: dict[str, dict[str, Any]] = {}
    taken: set[int] = set()  # bound only when the hosts start: kept out of the ephemeral range meanwhile
    for i in range(1, args.nodes + 1):
        name = f"node-{i:03d}"
        engine_port, agent_port = free_port_outside_ephemeral(taken), free_port_outside_ephemeral(taken)
        creds = dict(line.split("=", 1) for line in call(
            "quiver_node_register", name, "--agent-url", f"http://127.0.0.1:{agent_port}", "--engine-url",
            f"http://127.0.0.1:{engine_port}", "--base-model", served).splitlines() if "=" in line)
        nodes[name] = {"name": name, "engine_port": engine_port, "agent_port": agent_port,
                       "node_key": creds["QUIVER_NODE_KEY"], "node_token": creds["QUIVER_NODE_TOKEN"],
                       "cache_dir": str(workdir / "caches" / name), "max_loras": args.gpu_slots,
                       "max_cpu_loras": args.cpu_slots, "max_lora_rank": 32}
    node_env = {k: v for k, v in env.items() if k in (
        "AWS_S3_ENDPOINT_URL", "REDIS_URL")}  # no S3 credential: loads carry presigned GETs
    node_env.update({"QUIVER_HEARTBEAT_SECONDS": str(args.heartbeat_s),
                     "QUIVER_LOAD_PUBLISH_MS": str(args.load_publish_ms)})
    names = sorted(nodes)
    for h in range(0, len(names), args.nodes_per_host):
        spec = {"calibration": args.calibration, "base_model": served, "charge_all_linear": True,
                "stats_path": str(workdir / "probes" / f"host-{h // args.nodes_per_host}.json"),
                "env": node_env, "nodes": [{**nodes[n], "control_url": internal[names.index(n) % len(internal)]}
                                           for n in names[h:h + args.nodes_per_host]]}
        spec_path = workdir / f"host-{h // args.nodes_per_host}.spec.json"
        spec_path.write_text(json.dumps(spec))
        name = f"host-{h // args.nodes_per_host}"
        procs.start(name, ["nice", "-n", str(args.host_nice), PY, "-m", "devtools.hollow.host", str(spec_path)],
                    {k: v for k, v in env.items() if k not in ("QUIVER_NODE_SECRET", "DATABASE_URL")})
        # Each child has a session of its own, and the scheduler shares the CPU between sessions before nice counts
        # (autogroup): without this the hosts' nice did nothing and they competed as hard as the control plane.
        autogroup_nice(procs.procs[name].pid, args.host_nice)
    return nodes


def seed_usage(rows: int, days: float, seed: int) -> float:
    """Seed ``rows`` usage records for the first tenant (the one whose pages ``PageTimer`` reads) over ``days``
    ending now, Zipf over its uploaded adapters (``manage.py quiver_seed_usage``: COPY, then its rollups); returns
    the seconds taken.

    Raises:
        RuntimeError: the first tenant has no adapter (the command would create placeholder ones, which the
            reconciler would then try to warm from files that do not exist).
    """
    from adapters_app.models import Adapter

    adapters = Adapter.objects.filter(tenant__slug=tenant_slug(0)).count()
    if not adapters:
        raise RuntimeError(f"--usage-rows: tenant {tenant_slug(0)} has no adapter in this trace; pick another --seed")
    t0 = time.monotonic()
    call("quiver_seed_usage", "--tenant", tenant_slug(0), "--rows", str(rows), "--days", f"{days:g}",
         "--seed", str(seed), "--adapters", str(adapters))
    return time.monotonic() - t0


def upload_all(web: str, keys: list[str], folders: list[Path], tenant_of: list[int], served: str) -> None:
    """Upload every adapter through the public API with its tenant's key (8 at a time), then wait until every
    version is validated."""
    from concurrent.futures import ThreadPoolExecutor

    from adapters_app.models import AdapterVersion

    clients = [httpx.Client(base_url=web, timeout=300, headers={"Authorization": f"Bearer {k}"}) for k in keys]

    def one(i: int) -> None:
        upload_adapter(clients[tenant_of[i]], adapter_name(i), folders[i], base_model=served)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(folders))))
    pending = AdapterVersion.objects.exclude(status__in=("ready", "rejected"))
    wait_until("validation", lambda: not pending.exists(), timeout=60 + 2.0 * len(folders), every=2)
    rejected = AdapterVersion.objects.filter(status="rejected").count()
    if rejected:
        raise RuntimeError(f"{rejected} adapters were rejected")


def process_cpu(procs: Processes) -> dict[str, float]:
    """CPU seconds (user + system, children included) spent so far by each role's processes (``gateway-2`` counts
    under ``gateway``)."""
    import psutil

    out: dict[str, float] = {}
    for name, popen in procs.procs.items():
        role = name.rstrip("0123456789").rstrip("-")
        try:
            proc = psutil.Process(popen.pid)
            times = [proc.cpu_times(), *(c.cpu_times() for c in proc.children(recursive=True))]
        except psutil.NoSuchProcess:
            continue
        out[role] = out.get(role, 0.0) + sum(t.user + t.system for t in times)
    return out


def db_bytes() -> int:
    """The run database's size (PostgreSQL's ``pg_database_size``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return int(cursor.fetchone()[0])


def evict_one(operator: httpx.Client, probe_dir: Path, rng: Any, log: list[tuple[float, int, int]]) -> None:
    """Evict one served adapter from one node as an operator and mark it for the gateways' probes; ``log`` gets
    ``(wall time s, node id, version id)`` of each accepted eviction."""
    from inference.fleet.models import Placement

    rows = list(Placement.objects.filter(served=True, pinned=False, tier__in=("hot", "warm"))
                .values_list("pk", "node_id", "adapter_version_id")[:200])
    if not rows:
        return
    pk, node_id, version_id = rows[int(rng.integers(len(rows)))]
    t0 = time.time()
    if operator.post(f"/api/v1/operator/placements/{pk}/evict").status_code == 202:
        log.append((t0, node_id, version_id))
        marker = {"id": f"{pk}-{t0}", "node_id": node_id, "version_id": version_id, "t0": t0}
        (probe_dir / "marker.tmp").write_text(json.dumps(marker))
        (probe_dir / "marker.tmp").replace(probe_dir / "marker.json")


def run_keys(trace: Any, t0: float, evictions: list[tuple[float, int, int]], passes: list[float],
             prior: dict[int, int]) -> dict[str, Any]:
    """What the simulator needs of the live run to model it: ``ids`` (each trace adapter's version id, its
    ``lora_int_id`` and HRW key), ``nodes`` (the node names, HRW keys too), ``evictions`` (the operator's, as
    (s from the replay's start ``t0``, node name, version id)), ``reconciles`` (the reconciler's pass start times
    ``passes``, wall s, as s from ``t0``; None when there are none) and ``prior`` (adapter index → its requests before the replay: the
    gateways' first reads)."""
    from adapters_app.models import AdapterVersion
    from inference.fleet.models import Node

    names = dict(Node.objects.values_list("pk", "name"))
    version = {name: pk for pk, name in AdapterVersion.objects.values_list("pk", "adapter__name")}
    return {"ids": [version[adapter_name(a)] for a in range(len(trace.rank_of))], "nodes": sorted(names.values()),
            "evictions": [(at - t0, names[n], v) for at, n, v in evictions],
            # None (a pass every 30 s in the simulator) when the worker's probe recorded none at all
            "reconciles": sorted(at - t0 for at in passes) if passes else None, "prior": prior}


def record(path: Path, trace: Any, keys: dict[str, Any], probe_dir: Path, t0: float) -> None:
    """Write ``--record``: the trace (times s, adapter indexes, ranks, tenants), :func:`run_keys` and every
    engine's events (``devtools.hollow.engine.HollowEngine.events``), times in s from the replay's start ``t0``
    (``python -m devtools.hollow.compare`` reads it)."""
    engines: dict[str, list[tuple[float, int, str]]] = {}
    for host in figures.read_probes(probe_dir, "host"):
        for node, stats in host.get("engines", {}).items():
            engines[node] = [(at - t0, v, what) for at, v, what in stats.get("events", [])]
    path.write_text(json.dumps({
        "times": trace.times.tolist(), "adapters": trace.adapters.tolist(), "rank_of": list(trace.rank_of),
        "tenant_of": list(trace.tenant_of), **keys, "engines": engines}))


def main(argv: list[str] | None = None) -> int:  # noqa: C901, PLR0915 - one linear scenario
    """Run the scale scenario; see the module docstring. Returns the exit status."""
    import numpy as np

    args = parse(argv)
    started = time.monotonic()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's root INFO logging would print every request
    spec = WorkloadSpec(adapters=args.adapters, requests=max(1, int(args.rate * args.duration)), zipf=args.zipf,
                        rate=args.rate, cv=args.cv, tenants=args.tenants, on_off=args.on_off, drift=args.drift,
                        seed=args.seed)
    trace = generate(spec)
    costs = calibration(args.calibration)
    assets = ensure_demo_assets()
    workdir = args.workdir
    probe_dir = workdir / "probes"
    for sub in ("logs", "probes"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
        for old in (workdir / sub).glob("*"):
            old.unlink()
    folders = make_adapters(workdir / "adapters", assets.base_dir, assets.served_name, trace.rank_of)
    procs = Processes(workdir / "logs")
    password = secrets.token_urlsafe(12)
    peak_rss = 0
    with ExitStack() as stack:
        env = {**os.environ}
        env.update(stack.enter_context(backing_services(env)))
        stack.callback(procs.stop_all)
        env["DATABASE_URL"] = stack.enter_context(fresh_database(env["DATABASE_URL"]))
        env["AWS_STORAGE_BUCKET_NAME"] = stack.enter_context(fresh_bucket(env))
        env["REDIS_URL"] = env["CELERY_BROKER_URL"] = redis_db(env["REDIS_URL"], REDIS_DB)
        env.update({"DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false",
                    "DJANGO_SECRET_KEY": secrets.token_urlsafe(48), "QUIVER_API_KEY_HMAC_KEY": secrets.token_urlsafe(48),
                    "QUIVER_NODE_SECRET": secrets.token_urlsafe(48), "QUIVER_NODE_STALE_AFTER_S": "30",
                    "QUIVER_HOLLOW_PROBE_DIR": str(probe_dir), "QUIVER_LOG_LEVEL": "WARNING"})
        if args.usage_rows:
            # A deployment that keeps the seeded year of raw records: with the default 90 days the hourly retention
            # pass deleted 7.5 million of them during the replay, and the pages were measured on a shrinking table.
            env["QUIVER_USAGE_RETENTION_DAYS"] = str(math.ceil(args.usage_days) + 1)
        say(f"{args.nodes} nodes, {args.adapters} adapters, {args.tenants} tenants, {len(trace.times)} requests; "
            "migrating a fresh database")
        manage(env, "migrate", "--noinput")
        manage(env, "quiver_base_model_register", assets.served_name, str(assets.base_dir), "--max-lora-rank", "32")
        os.environ.update(env)
        import django

        django.setup()
        keys = [call("quiver_tenant_create", tenant_slug(t)).splitlines()[-1] for t in range(args.tenants)]
        call("quiver_user_create", "operator", "--staff", QUIVER_USER_PASSWORD=password)
        urls = start_control_plane(procs, env, args.gateways, args.listeners)
        start_nodes(procs, env, args, assets.served_name,
                    [urls[f"web-internal-{i}"] for i in range(1, args.listeners + 1)], workdir)
        for name, url in urls.items():
            procs.wait_http(name, url + "/healthz", 300)
        from inference.fleet.models import Node, Placement
        from inference.metering.models import UsageRecord

        say(f"control plane up; waiting for {args.nodes} nodes to report live")
        wait_until("nodes live", lambda: Node.objects.filter(healthy=True).count() >= args.nodes, timeout=300)
        say(f"uploading {args.adapters} adapters through the public API")
        upload_all(urls["web"], keys, folders, trace.tenant_of, assets.served_name)
        say("validated; waiting for the warms placed at upload to settle")
        wait_until("warms", lambda: not Placement.objects.exclude(warming_since=None).exists(), timeout=300, every=2)
        if args.usage_rows:
            say(f"seeding {args.usage_rows:,} usage records for {tenant_slug(0)} over {args.usage_days:g} days")
            seed_s = seed_usage(args.usage_rows, args.usage_days, args.seed)
            say(f"seeded in {seed_s:.0f} s ({args.usage_rows / seed_s:,.0f} rows/s)")
        operator = operator_client(urls["web"], password)
        pages = PageTimer(urls["web"], keys[0], operator)
        pages.once()  # first-use costs out of the window
        for url in (urls[f"gateway-{i}"] for i in range(1, args.gateways + 1)):  # each gateway reads its view once
            httpx.post(url + "/v1/completions", json={"model": adapter_name(0), "prompt": "x", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {keys[trace.tenant_of[0]]}"}, timeout=120)
        time.sleep(figures.PROBE_DUMP_S + 0.5)  # the probes' files are written every 2 s

        def memory() -> None:
            nonlocal peak_rss
            peak_rss = max(peak_rss, tree_rss_bytes(os.getpid()))

        rng = np.random.default_rng(args.seed + 99)
        gateway_files = figures.read_probes(probe_dir, "gateway")
        skip = {k: figures.counts(gateway_files, k) for k in ("fleet_view_ms", "fleet_view_cpu_ms", "propagation_ms")}
        internal_files = figures.read_probes(probe_dir, "internal")
        internal_skip = {k: figures.counts(internal_files, k)
                         for k in ("heartbeat_ms", "heartbeat_cpu_ms", "heartbeat_db_ms", "heartbeat_wait_ms")}
        worker_files = figures.read_probes(probe_dir, "worker")
        worker_skip = {k: figures.counts(worker_files, k)
                       for k in ("fleet_reconcile_task_ms", "fleet_reconcile_task_cpu_ms", "placement_evict_task_ms",
                                 "placement_evict_task_at")}
        cpu_before = [(f["totals"].get("fleet_cpu_ms", 0.0), f["totals"]["at"]) for f in gateway_files]
        hosts_before = figures.engine_totals(figures.read_probes(probe_dir, "host"))
        db_before = db_bytes()
        cpu0, wall0 = process_cpu(procs), time.monotonic()
        evictions: list[tuple[float, int, int]] = []
        samplers = [Sampler(memory, 2.0), Sampler(pages.once, 3.0)]
        if args.evict_every_s > 0:
            samplers.append(Sampler(lambda: evict_one(operator, probe_dir, rng, evictions), args.evict_every_s))
        for s in samplers:
            s.start()
        gateways = [urls[f"gateway-{i}"] for i in range(1, args.gateways + 1)]
        requests = [(keys[trace.tenant_of[a]], adapter_name(a)) for a in trace.adapters.tolist()]
        say(f"replaying {len(requests)} requests over {trace.times[-1]:.0f} s through {len(gateways)} gateways")
        replay_t0 = time.time()
        result = replay(trace.times.tolist(), requests, gateways, max_tokens=args.max_tokens)
        time.sleep(figures.PROBE_DUMP_S + 1)  # the probes' last files
        for s in samplers:
            s.stop()
        db_after = db_bytes()
        usage_rows = UsageRecord.objects.count()
        cpu1, wall1 = process_cpu(procs), time.monotonic()
        routable = Placement.objects.exclude(tier="cold", served=False).count()
        gateway_files = figures.read_probes(probe_dir, "gateway")
        hosts_after = figures.engine_totals(figures.read_probes(probe_dir, "host"))
        internal_files = figures.read_probes(probe_dir, "internal")
        heartbeats = figures.samples(internal_files, "heartbeat_ms", internal_skip["heartbeat_ms"])
        heartbeat_cpu = figures.samples(internal_files, "heartbeat_cpu_ms", internal_skip["heartbeat_cpu_ms"])
        worker_files = figures.read_probes(probe_dir, "worker")
        reconciles = figures.samples(worker_files, "fleet_reconcile_task_ms", worker_skip["fleet_reconcile_task_ms"])
        reconcile_cpu = figures.samples(worker_files, "fleet_reconcile_task_cpu_ms",
                                        worker_skip["fleet_reconcile_task_cpu_ms"])
        shares = []
        for (fleet_cpu0, at0), f in zip(cpu_before, gateway_files, strict=False):
            wall = f["totals"]["at"] - at0
            if wall > 0:
                shares.append((f["totals"].get("fleet_cpu_ms", 0.0) - fleet_cpu0) / 1000 / wall)
        load = os.getloadavg()
        live_keys = run_keys(trace, replay_t0, evictions, figures.samples(worker_files, "fleet_reconcile_task_at"),
                             prior={int(trace.adapters[0]): args.gateways})
        if args.record:
            record(args.record, trace, live_keys, probe_dir, replay_t0)
    served = {k: hosts_after[k] - hosts_before[k] for k in hosts_after}
    n = sum(result.statuses.values())
    pages_all = [v for values in pages.samples.values() for v in values]
    out: dict[str, Any] = {
        "nodes": args.nodes, "adapters": args.adapters, "tenants": args.tenants, "rate": args.rate,
        "duration_s": round(result.wall_s, 1), "gateways": args.gateways, "calibration": args.calibration,
        "heartbeat_ms_p50": figures.pct(heartbeats, 50), "heartbeat_ms_p99": figures.pct(heartbeats, 99),
        "heartbeat_cpu_ms_p99": figures.pct(heartbeat_cpu, 99), "heartbeats": len(heartbeats),
        # where a slow accept's time went: its queries' wall time, and the time before its view ran
        **{f"{k}_p99": figures.pct(figures.samples(internal_files, k, internal_skip[k]), 99)
           for k in ("heartbeat_db_ms", "heartbeat_wait_ms")},
        "fleet_view_ms_p99": figures.pct(figures.samples(gateway_files, "fleet_view_ms", skip["fleet_view_ms"]), 99),
        "fleet_view_cpu_ms_p99": figures.pct(figures.samples(gateway_files, "fleet_view_cpu_ms",
                                                             skip["fleet_view_cpu_ms"]), 99),
        "fleet_view_cpu_share": max(shares) if shares else None,
        "propagation_ms_p99": figures.pct(figures.samples(gateway_files, "propagation_ms",
                                                          skip["propagation_ms"]), 99),
        "propagation_samples": len(figures.samples(gateway_files, "propagation_ms", skip["propagation_ms"])),
        "reconcile_ms_p99": figures.pct(reconciles, 99), "reconcile_cpu_ms_p99": figures.pct(reconcile_cpu, 99),
        "reconciles": len(reconciles),
        # the operator evict's own run (node call and writes): the part of propagation_ms spent in the worker
        "evict_task_ms_p99": figures.pct(figures.samples(worker_files, "placement_evict_task_ms",
                                                         worker_skip["placement_evict_task_ms"]), 99),
        # from the operator's evict call to the task's start: the part of propagation_ms spent queued
        "evict_wait_ms_p99": figures.pct(figures.waits([t0 for t0, _, _ in evictions], figures.samples(
            worker_files, "placement_evict_task_at", worker_skip["placement_evict_task_at"])), 99),
        "api_ms_p99": figures.pct(pages_all, 99),
        **{f"api_ms_p99_{k}": figures.pct(v, 99) for k, v in sorted(pages.samples.items())},
        "usage_rows": usage_rows,
        "gateway_errors_5xx": sum(c for s, c in result.statuses.items() if s >= 500 or s == 0),
        "requests": n, "ok": result.statuses.get(200, 0),
        "statuses": {str(k): v for k, v in sorted(result.statuses.items())},
        "latency_ms_p50": figures.pct(result.latencies_ms, 50), "latency_ms_p99": figures.pct(result.latencies_ms, 99),
        "client_lag_ms_p99": figures.pct(result.lag_ms, 99),
        "served_resident_share": served["resident"] / served["requests"] if served["requests"] else None,
        "loads_per_1k": 1000 * served["loads_total"] / n if n else None,
        "loads_per_1k_by_source": {"agent_add_lora": 1000 * served["loads_add_lora"] / n if n else None,
                                   "engine_reload": 1000 * served["loads_request"] / n if n else None},
        "warmed_share": served["warmed"] / served["requests"] if served["requests"] else None,
        **figures.simulated(trace, costs, nodes=live_keys["nodes"], ids=live_keys["ids"],
                            evictions=live_keys["evictions"], reconciles=live_keys["reconciles"],
                            prior=live_keys["prior"], gpu_slots=args.gpu_slots, cpu_slots=args.cpu_slots,
                            max_tokens=args.max_tokens, seed=args.seed),
        "db_bytes_per_1m_requests": (db_after - db_before) / n * 1e6 if n else None,
        "placements_routable": routable,
        "cpu_cores_by_role": {role: round((cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) / (wall1 - wall0), 3)
                              for role in sorted(cpu1)},
        "db_bytes_per_s": round((db_after - db_before) / result.wall_s) if result.wall_s else None,
        "peak_rss_mib": round(peak_rss / (1 << 20)), "load_average": [round(x, 2) for x in load],
        "errors": {str(k): v for k, v in result.errors.items()}, "total_s": round(time.monotonic() - started),
    }
    print(json.dumps(out, indent=2) if args.json else "\n".join(figures.table(out)), flush=True)
    if not args.json:  # the table leaves out nested values; the codes behind gateway_errors_5xx are among them
        say(f"statuses {out['statuses']}; errors {out['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
