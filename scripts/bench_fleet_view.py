"""Benchmark a gateway process's fleet view refresh at issue 31's scale: the full re-read it did before against the
change read it does now (``inference.gateway.fleet_reader``), side by side in one run, on PostgreSQL.

Seeds ``--nodes`` nodes (64), ``--tenants`` tenants (200) with ``--adapters`` adapters (2,000, one ready version
each) and about 1.4 placements per version that serve or failed (~2,800: hot, warm, staged and served, errored)
plus ``--cold`` cold rows, and publishes a reconciler plan to Redis (the view reads it too). Then it replays
``--refreshes`` refresh intervals of ``QUIVER_GATEWAY_FLEET_REFRESH_S`` (0.5 s) of simulated time, without
sleeping: in each, the heartbeats that fall due (every node every ``--heartbeat-s`` 5 s, so 6.4 an interval at 64
nodes) update their node row as an accept does (last heartbeat, gauges, the stored report) and most move a few of
the node's placement rows (``--moves`` 0 to 4 each: to or from cold, between staged, warm and hot), written as the
accept writes them (``QuerySet.update``); every ``--delete-every`` intervals an adapter is deleted (its version's
placements with it) and one is warmed on a new node (an INSERT). After the writes, both reads run (in alternating
order) and their views are compared: ``mismatches`` must be 0. The change read's periodic full read
(``FULL_EVERY_S``, 60 s) is forced every 120 intervals, as it falls at 0.5 s refreshes, and counted in its figures.
Time is simulated, so the in-process copies of the reconciler's plan are expired every 4 intervals (their 2 s),
and every 60 intervals (a 30 s reconcile period) a plan moving 3 versions is published. "before" is the code at
e6bfda2, copied here (the full re-read and the plan read whole every 2 s).

Prints wall ms and this thread's CPU ms per refresh (p50, p99, max, mean) and rows read per refresh for each, and
the CPU share of one core at one refresh per 0.5 s (mean CPU / 500 ms). ``--reconcile N`` then times reconcile
passes (``inference.fleet.reconcile.fleet_reconcile``, CPU of the calling thread) over the same fleet: N processes
of two passes each (the first of a process pays its imports' and caches' warm-up; the second is the steady
pass of a long-lived Celery worker), both printed, with ``--before-tree DIR`` (e.g. ``git archive e6bfda2 | tar -x
-C DIR``) alternating with the same passes of that tree's code on the same database. No usage rows are seeded: every
rate is 0, so the passes warm nothing after the first. ``--json`` prints one object.

``--seed-only`` seeds that fleet (unless a node ``bfv-node-0`` exists already) plus ``--usage`` usage records over
the last hour ending now (a 64-node ``fleet_scale`` replay's: 40 req/s for 300 s = 12,000), Zipf over the versions,
each on one of its version's nodes, 1 % answered 5xx, and exits: ``scripts/bench_usage_scale --fleet`` times the
operator pages on that state.

Usage:
    ./scripts/bench_fleet_view [--nodes 64] [--adapters 2000] [--tenants 200] [--refreshes 600] [--reconcile 5]
                               [--before-tree DIR] [--seed 1] [--json]
    ./scripts/bench_fleet_view --seed-only [--usage 12000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
INTERVAL_S = 0.5
FULL_EVERY = 120  # refreshes between the change reader's full reads: FULL_EVERY_S (60 s) / 0.5 s
PLAN_EVERY = 60  # refreshes between reconcile passes (30 s), each publishing its plan
PLAN_CACHE = 4  # refreshes a process keeps its copy of the plan: PLAN_CACHE_S (2 s) / 0.5 s


def load_fleet_before() -> Any:
    """The full re-read as it was before the change reads (``inference.gateway.directory.load_fleet`` at e6bfda2),
    kept verbatim here as the baseline: live nodes, every placement on them that serves or failed, the plan."""
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from inference.fleet.models import Node, Placement
    from inference.fleet.node_keys import node_credentials
    from inference.gateway.fleet_reader import _gpu_used
    from inference.gateway.snapshot import FleetView, NodeView, PlacementView

    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, name, key_generation, engine_url, base_model_id, max_lora_rank, max_loras, "
            "state -> 'residency' -> 'gpu', "
            "num_requests_running, num_requests_waiting, kv_cache_usage_perc "
            f"FROM {Node._meta.db_table} WHERE healthy = %s AND last_heartbeat_at >= %s "  # noqa: S608
            "AND base_model_id IS NOT NULL ORDER BY id",
            [True, connection.ops.adapt_datetimefield_value(fresh)])
        node_rows = cursor.fetchall()
        placement_rows: list[tuple[Any, ...]] = []
        if node_rows:
            marks = ", ".join(["%s"] * len(node_rows))
            cursor.execute(
                "SELECT node_id, adapter_version_id, tier, served, last_error, warming_since "
                f"FROM {Placement._meta.db_table} WHERE node_id IN ({marks}) "  # noqa: S608
                "AND NOT (tier = %s AND served = %s)",
                [*(row[0] for row in node_rows), Placement.Tier.COLD.value, False])
            placement_rows = cursor.fetchall()
    nodes = tuple(
        NodeView(pk=pk, name=name, engine_url=engine_url.rstrip("/"), base_model_id=base_model_id,
                 key=node_credentials(name, generation).key, max_lora_rank=max_lora_rank, max_loras=max_loras,
                 gpu_used=_gpu_used(gpu), num_requests_running=running or 0, num_requests_waiting=waiting or 0,
                 kv_cache_usage_perc=kv or 0.0)
        for pk, name, generation, engine_url, base_model_id, max_lora_rank, max_loras, gpu, running, waiting, kv
        in node_rows
    )
    placements: dict[int, list[PlacementView]] = {}
    for node_id, version_id, tier, served, last_error, warming_since in placement_rows:
        code = (last_error or "").split(":", 1)[0] if tier == Placement.Tier.ERRORED and warming_since is None else ""
        placements.setdefault(version_id, []).append(
            PlacementView(node_id=node_id, version_id=version_id, tier=tier, served=bool(served), error_code=code))
    return FleetView(nodes=nodes, placements={k: tuple(v) for k, v in placements.items()}, read_at=time.monotonic(),
                     homes=plan_all_before())


_plan_before: list[Any] = [float("-inf"), {}]  # the baseline's own in-process copy of the plan


def plan_all_before() -> dict[int, tuple[str, ...]]:
    """``inference.fleet.plan.plan_all`` as it was at e6bfda2 (its lock and Redis backoff left out): past
    ``PLAN_CACHE_S``, the whole plan read (HGETALL) and parsed again."""
    from common.redis import sync_client
    from inference.fleet.plan import PLAN_CACHE_S, plan_key

    if time.monotonic() - _plan_before[0] < PLAN_CACHE_S:
        return _plan_before[1]  # type: ignore[no-any-return]
    client = sync_client()
    assert client is not None
    out: dict[int, tuple[str, ...]] = {}
    for key, value in client.hgetall(plan_key()).items():
        try:
            version_id = int(key)
        except ValueError:
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        out[version_id] = tuple(n for n in text.split(",") if n)
    _plan_before[:] = [time.monotonic(), out]
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether two fleet views route alike: the same nodes, and per version the same placements on any order."""
    return a.nodes == b.nodes and {v: frozenset(p) for v, p in a.placements.items()} == {
        v: frozenset(p) for v, p in b.placements.items()}


def _seed(args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    from django.utils import timezone

    from adapters_app.models import Adapter, AdapterVersion, BaseModel
    from inference.fleet.models import Node, Placement
    from inference.fleet.plan import plan_publish
    from tenants.models import Tenant

    base = BaseModel.objects.create(base_model_name="bench-fleet-view", architecture="LlamaForCausalLM",
                                    hf_config={}, facts={})
    tenants = Tenant.objects.bulk_create([Tenant(slug=f"bfv-{i}", name=f"bfv {i}") for i in range(args.tenants)])
    adapters = Adapter.objects.bulk_create([Adapter(tenant=tenants[i % len(tenants)], name=f"a{i}", base_model=base)
                                            for i in range(args.adapters)])
    versions = AdapterVersion.objects.bulk_create([
        AdapterVersion(tenant_id=a.tenant_id, adapter=a, number=1, sha256=f"{i:064x}", size_bytes=80 << 20,
                       s3_prefix=f"x/{i}/", files=[], status="ready", r=16) for i, a in enumerate(adapters)])
    now = timezone.now()
    nodes = Node.objects.bulk_create([
        Node(name=f"bfv-node-{i}", base_model=base, agent_url=f"http://n{i}:1", engine_url=f"http://n{i}:2",
             healthy=True, last_heartbeat_at=now, max_loras=8, max_cpu_loras=48, max_lora_rank=64,
             state={"residency": {"gpu": 4}}, num_requests_running=0, num_requests_waiting=0,
             kv_cache_usage_perc=0.1) for i in range(args.nodes)])
    rows, plan = [], {}
    for i, version in enumerate(versions):
        homes = rng.sample(nodes, 2 if i % 5 < 2 else 1)
        plan[version.pk] = tuple(n.name for n in homes)
        for node in homes:
            draw = rng.random()
            tier, served = (("hot", True) if draw < 0.3 else ("warm", True) if draw < 0.7 else
                            ("staged", True) if draw < 0.9 else ("errored", False) if draw < 0.92 else
                            ("staged", False))
            rows.append(Placement(node=node, adapter_version=version, tier=tier, served=served,
                                  last_error="load_failed: x" if tier == "errored" else ""))
    taken = {(p.node_id, p.adapter_version_id) for p in rows}
    wanted = len(rows) + min(args.cold, len(nodes) * len(versions) - len(taken))
    while len(rows) < wanted:
        node, version = rng.choice(nodes), rng.choice(versions)
        if (node.pk, version.pk) not in taken:
            taken.add((node.pk, version.pk))
            rows.append(Placement(node=node, adapter_version=version, tier="cold"))
    Placement.objects.bulk_create(rows, batch_size=2000)
    plan_publish(plan)
    return {"nodes": nodes, "versions": versions, "adapters": adapters}


def _seed_usage(records: int, rng: random.Random) -> int:
    """``records`` usage records of the seeded fleet's tenants over the last hour ending now (Zipf over the versions,
    each on a node holding its version; 1 % 503, 3 % 429), bulk-inserted. Returns the number written."""
    from django.utils import timezone

    from adapters_app.models import AdapterVersion
    from inference.fleet.models import Placement
    from inference.metering.models import UsageRecord

    versions = list(AdapterVersion.objects.filter(adapter__name__startswith="a", tenant__slug__startswith="bfv-")
                    .values_list("pk", "tenant_id", "adapter__name", "number").order_by("pk"))
    homes: dict[int, list[int]] = {}
    for version_id, node_id in Placement.objects.filter(adapter_version_id__in=[v[0] for v in versions]).exclude(
            tier="cold", served=False).values_list("adapter_version_id", "node_id"):
        homes.setdefault(version_id, []).append(node_id)
    weights = [1 / (i + 1) for i in range(len(versions))]
    now, rows = timezone.now(), []
    for pick in rng.choices(range(len(versions)), weights=weights, k=records):
        version_id, tenant_id, name, number = versions[pick]
        draw = rng.random()
        status = 503 if draw < 0.01 else 429 if draw < 0.04 else 200
        latency = rng.lognormvariate(5.5, 0.6)
        rows.append(UsageRecord(
            tenant_id=tenant_id, adapter_version_id=version_id, node_id=rng.choice(homes.get(version_id) or [None]),
            model_name=name, version_number=number, endpoint="completions", stream=draw < 0.6,
            status_code=status, prompt_tokens=rng.randint(20, 400), completion_tokens=rng.randint(1, 200),
            latency_ms=latency, ttft_ms=latency / 4 if draw < 0.6 else None,
            created_at=now - timedelta(seconds=rng.uniform(0, 3600))))
    UsageRecord.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def _heartbeat(node_pk: int, moves: int, rng: random.Random) -> int:
    """One accept's writes: the node row always, and ``moves`` of its placement rows (as ``nodes.py`` writes them)."""
    from django.utils import timezone

    from inference.fleet.models import Node, Placement

    Node.objects.filter(pk=node_pk).update(
        last_heartbeat_at=timezone.now(), num_requests_running=rng.randint(0, 8), num_requests_waiting=rng.randint(0, 2),
        kv_cache_usage_perc=rng.random(), state={"residency": {"gpu": rng.randint(0, 8)}})
    pks = list(Placement.objects.filter(node_id=node_pk).values_list("pk", flat=True))
    for pk in rng.sample(pks, min(moves, len(pks))):
        tier = rng.choice(["cold", "staged", "warm", "hot"])
        Placement.objects.filter(pk=pk).update(tier=tier, served=tier != "cold" and rng.random() < 0.9)
    return min(moves, len(pks))


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    nearest_rank = max(0, math.ceil(0.99 * len(ordered)) - 1)
    return {"p50": round(statistics.median(ordered), 3), "p99": round(ordered[nearest_rank], 3),
            "max": round(ordered[-1], 3), "mean": round(statistics.fmean(ordered), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--cold", type=int, default=3000, help="cold placement rows (evicted history)")
    parser.add_argument("--refreshes", type=int, default=600)
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--moves", type=int, default=4, help="most placement rows a heartbeat moves (0..N each)")
    parser.add_argument("--delete-every", type=int, default=100, help="intervals between adapter deletions")
    parser.add_argument("--reconcile", type=int, default=0,
                        help="processes of 2 reconcile passes each to time after the refreshes")
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="an older checkout whose reconcile passes are timed beside this tree's")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed-only", action="store_true", help="seed the fleet and --usage records, then exit")
    parser.add_argument("--usage", type=int, default=12_000, help="--seed-only: usage records in the last hour")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("run through ./scripts/bench_fleet_view (it starts PostgreSQL and Redis)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ.setdefault("DJANGO_DEBUG", "false")
    os.environ.setdefault("DJANGO_LOG_LEVEL", "WARNING")
    for secret in ("DJANGO_SECRET_KEY", "QUIVER_NODE_SECRET", "QUIVER_API_KEY_HMAC_KEY"):
        os.environ.setdefault(secret, os.urandom(32).hex())  # a throwaway database: throwaway secrets
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from adapters_app.models import Adapter
    from inference.fleet import plan
    from inference.fleet.models import Placement
    from inference.fleet.plan import plan_publish
    from inference.gateway.fleet_reader import FleetReader

    rng = random.Random(args.seed)
    t0 = time.monotonic()
    if args.seed_only:
        from inference.fleet.models import Node

        fleet = not Node.objects.filter(name="bfv-node-0").exists()
        if fleet:
            _seed(args, rng)
        usage = _seed_usage(args.usage, rng)
        print(json.dumps({"fleet_seeded": fleet, "usage_seeded": usage, "seed_s": round(time.monotonic() - t0, 1)}))
        return 0
    seeded = _seed(args, rng)
    report: dict[str, Any] = {
        "nodes": args.nodes, "adapters": args.adapters, "tenants": args.tenants,
        "placements_routable": Placement.objects.exclude(tier="cold", served=False).count(),
        "placements_cold": Placement.objects.filter(tier="cold", served=False).count(),
        "seed_s": round(time.monotonic() - t0, 1)}
    homes = plan.plan_all()
    reader = FleetReader(full_every_s=float("inf"))  # its full reads are forced below, by simulated time
    reader.load()
    figures: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": [], "rows": []}
                                                  for k in ("before", "after", "after_changes", "after_full")}
    due = [rng.uniform(0, args.heartbeat_s) for _ in seeded["nodes"]]
    mismatches = moved = heartbeats = 0
    alive = list(seeded["adapters"])
    for step in range(args.refreshes):
        now_s = (step + 1) * INTERVAL_S
        for i, node in enumerate(seeded["nodes"]):
            if due[i] <= now_s:
                due[i] += args.heartbeat_s
                heartbeats += 1
                moved += _heartbeat(node.pk, rng.randint(0, args.moves), rng)
        if args.delete_every and step % args.delete_every == args.delete_every - 1 and len(alive) > 1:
            alive.pop(rng.randrange(len(alive))).delete()
            version = alive[rng.randrange(len(alive))].versions.first()
            for node in rng.sample(seeded["nodes"], len(seeded["nodes"])):
                if not Placement.objects.filter(node=node, adapter_version=version).exists():
                    Placement.objects.create(node=node, adapter_version=version, tier="warm", served=True)
                    break
        if step % FULL_EVERY == FULL_EVERY - 1:
            reader.reset()
        if step % PLAN_EVERY == PLAN_EVERY - 1:  # a reconcile pass moves a few versions' homes
            for version_id in rng.sample(list(homes), 3):
                homes[version_id] = (rng.choice(seeded["nodes"]).name,)
            plan_publish(homes)
        if step % PLAN_CACHE == 0:  # both copies of the plan expire as they would in 2 s
            _plan_before[0] = float("-inf")
            plan._cached = (float("-inf"), plan._cached[1])
        views = {}
        for name in (("before", "after") if step % 2 else ("after", "before")):
            wall, cpu = time.perf_counter(), time.thread_time()
            views[name] = load_fleet_before() if name == "before" else reader.load()
            figures[name]["cpu"].append((time.thread_time() - cpu) * 1000)
            figures[name]["wall"].append((time.perf_counter() - wall) * 1000)
            figures[name]["rows"].append(
                float(len(views[name].nodes) + sum(len(p) for p in views[name].placements.values()))
                if name == "before" else float(reader.rows_read))
            if name == "after":  # the same sample, filed by the kind of read it was as well
                for key, samples in figures[name].items():
                    figures[f"after_{reader.last_read}"][key].append(samples[-1])
        mismatches += not _same(views["before"], views["after"])
    for name, series in figures.items():
        if not series["cpu"]:
            continue
        report[name] = {"wall_ms": _stats(series["wall"]), "cpu_ms": _stats(series["cpu"]),
                        "rows": _stats(series["rows"]),
                        "cpu_share": round(statistics.fmean(series["cpu"]) / (INTERVAL_S * 1000), 5),
                        "count": len(series["cpu"])}
    report.update(refreshes=args.refreshes, heartbeats=heartbeats, placement_rows_moved=moved,
                  adapters_deleted=len(seeded["adapters"]) - len(alive), mismatches=mismatches,
                  simulated_s=args.refreshes * INTERVAL_S, adapters_left=Adapter.objects.count(),
                  reconcile_passes=args.reconcile)
    if args.reconcile:
        # Alternating trees, one pass set each, so both share the machine's load; the first pass of each warms up.
        trees = {"after": REPO, **({"before": args.before_tree} if args.before_tree else {})}
        runs: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in trees}
        for _ in range(args.reconcile):
            for name, tree in trees.items():
                runs[name].append(_reconcile(2, tree))
        report["reconcile_cpu_ms"] = {name: {which: {"cpu": _stats([r[i][0] for r in rs]),
                                                     "wall": _stats([r[i][1] for r in rs])}
                                             for i, which in enumerate(("first", "second"))}
                                      for name, rs in runs.items()}
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 1 if mismatches else 0


_PASSES = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import django
django.setup()
from inference.fleet.reconcile import fleet_reconcile
out = []
for _ in range(int(sys.argv[1])):
    wall, cpu = time.perf_counter(), time.thread_time()
    fleet_reconcile()
    out.append(((time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000))
print(json.dumps(out))
"""


def _reconcile(passes: int, tree: Path) -> list[tuple[float, float]]:
    """Time ``passes`` reconcile passes of the code in ``tree`` on this database, in a process of their own (so an
    older tree's code runs as it was): (CPU ms of the calling thread, wall ms) per pass."""
    out = subprocess.run([sys.executable, "-c", _PASSES, str(passes)], cwd=tree, env=os.environ, check=True,
                         capture_output=True, text=True)
    return [tuple(sample) for sample in json.loads(out.stdout.strip().splitlines()[-1])]


def _print(report: dict[str, Any]) -> None:
    print(f"{report['nodes']} nodes, {report['adapters']} adapters, {report['tenants']} tenants; "
          f"{report['placements_routable']:,} placements that serve or failed, {report['placements_cold']:,} cold; "
          f"{report['refreshes']} refreshes = {report['simulated_s']:.0f} s at 0.5 s; {report['heartbeats']} "
          f"heartbeats moved {report['placement_rows_moved']} placement rows; {report['adapters_deleted']} adapters "
          f"deleted; view mismatches: {report['mismatches']}")
    print(f"{'fleet view refresh (count)':<40}{'wall ms p50 / p99 / max':>26}{'CPU ms p50 / p99 / max':>26}"
          f"{'CPU ms mean':>13}{'CPU share':>11}{'rows p50':>10}")
    labels = {"before": "before: full re-read", "after": "after: change read (+1 full/120)",
              "after_changes": "  after, its change reads", "after_full": "  after, its full reads"}
    for name in (n for n in labels if n in report):
        r = report[name]
        w, c = r["wall_ms"], r["cpu_ms"]
        label = f"{labels[name]} ({r['count']})"
        print(f"{label:<40}{w['p50']:>10.2f} /{w['p99']:>7.2f} /{w['max']:>7.2f}"
              f"{c['p50']:>10.2f} /{c['p99']:>7.2f} /{c['max']:>7.2f}{c['mean']:>13.2f}{r['cpu_share']:>11.4f}"
              f"{r['rows']['p50']:>10.0f}")
    for name, passes in report.get("reconcile_cpu_ms", {}).items():
        for which, figures in passes.items():
            c, w = figures["cpu"], figures["wall"]
            print(f"reconcile, {name:<6} {which:<6} pass of {report['reconcile_passes']} processes: CPU ms p50 "
                  f"{c['p50']:.0f} / max {c['max']:.0f}; wall ms p50 {w['p50']:.0f} / max {w['max']:.0f}")


if __name__ == "__main__":
    raise SystemExit(main())
