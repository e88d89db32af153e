"""The console's API pages at a year of a busy tenant's traffic: issue 31's ``api_ms_p99`` at 10 million usage rows.

``scripts/fleet_scale`` times five pages (``devtools.hollow.replay.PageTimer``: a tenant's adapter list, its
``/api/v1/usage/traffic``, the operator's nodes and residency map (first pages), ``/api/v1/operator/traffic``) over
the run's own usage. This benchmark times those and every other call the console makes to read usage (``frontend/src/pages``:
Usage, Adapters, Traffic, the serving panel), plus the CSV export (``GET /api/v1/usage?export=csv``: to its first
byte and to its last), against a usage table seeded at scale:

- tenant ``bench-usage`` with ``--rows`` records (default 10,000,000) over 365 days ending now, Zipf over
  ``--adapters`` adapters (``manage.py quiver_seed_usage``); ``--other-tenants`` tenants ``bench-other-<i>`` with
  ``--other-rows`` each. Only missing rows are seeded (point ``DATABASE_URL`` at a kept database to reuse a
  seeding); when the newest record is older than a minute, the gap up to now is seeded at the rate of the week
  before it, so "the last hour" holds a last hour's records however long ago the year was seeded;
- ``--nodes`` registered nodes (no heartbeats: the nodes page reads their rows and the usage subquery of each);
- a staff user ``bench-operator`` for the operator pages (a console session, as the console calls them);
- with ``--fleet``, instead of the registered nodes, a 64-node run's fleet (``scripts/bench_fleet_view.py
  --seed-only``: ``--nodes`` 64 nodes, 200 tenants with 2,000 adapters, ~2,800 placements that serve or failed and
  3,000 cold ones) and ``--fleet-usage`` records of its tenants over the last hour (12,000: what a 64-node
  ``fleet_scale`` replay writes), so the operator pages answer for 64 nodes and 200 tenants' traffic.

It starts the web process the way the demo does (uvicorn serving ``config.asgi``) and calls it over real HTTP: each
round calls every page once, ``--reps`` rounds. With ``--before-tree DIR`` (an older checkout, e.g. ``git archive
<commit> | tar -x -C DIR``) a second web process serves that code from the same database and every call alternates
between the two, so both columns share the machine's load. Printed: wall ms p50 / p99 per page to the last byte
(the export also to its first byte), the CPU ms each call cost (the web process's and every PostgreSQL process's,
in 10 ms clock ticks; a database on another machine leaves them out), and ``api_ms_p99`` as fleet_scale computes it
(over its five pages together; an older tree without the paged residency map fails that page).

Usage:
    ./scripts/bench_usage_scale [--rows 10000000] [--reps 20] [--before-tree DIR] [--json]
                                [--fleet [--nodes 64] [--fleet-usage 12000]] [--only operator,adapters]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from bench_usage import TENANT, _manage, _percentile, _sql, bench_env, migrate_with_base_model  # noqa: E402

from demo.run import Processes, web_argv  # noqa: E402
from devtools.hollow.replay import operator_client  # noqa: E402
from devtools.proc import free_port  # noqa: E402

OPERATOR = "bench-operator"
TARGET_MS = 300.0
# (name, who calls it, path); fleet_scale's PageTimer pages are marked with FLEET_PAGES below.
PAGES: list[tuple[str, str, str]] = [
    ("adapters", "tenant", "/api/v1/adapters"),
    ("residency", "tenant", "/api/v1/residency"),
    ("usage totals (all time)", "tenant", "/api/v1/usage"),
    ("usage series 1h", "tenant", "/api/v1/usage/series?since=1h&bucket=minute"),
    ("usage series 24h", "tenant", "/api/v1/usage/series?since=24h&bucket=hour"),
    ("usage traffic 1h", "tenant", "/api/v1/usage/traffic"),
    ("usage traffic 24h", "tenant", "/api/v1/usage/traffic?since=24h"),
    ("versions seed-0 1h", "tenant", "/api/v1/usage/versions?adapter=seed-0"),
    ("operator nodes", "operator", "/api/v1/operator/nodes?limit=12"),  # the Fleet page's first page
    ("operator residency map", "operator", "/api/v1/operator/residency"),  # its first page of versions
    ("operator traffic 1h", "operator", "/api/v1/operator/traffic"),
    ("operator traffic 6h", "operator", "/api/v1/operator/traffic?since=6h"),
    ("operator traffic 24h", "operator", "/api/v1/operator/traffic?since=24h"),
    ("operator traffic 24h busy", "operator", f"/api/v1/operator/traffic?since=24h&tenant={TENANT}"),
    ("export 1h", "tenant", "/api/v1/usage?export=csv&since=1h"),
    ("export 24h", "tenant", "/api/v1/usage?export=csv&since=24h"),
]
FLEET_PAGES = ("adapters", "usage traffic 1h", "operator nodes", "operator residency map", "operator traffic 1h")


def say(msg: str) -> None:
    """One timestamped progress line on stderr (stdout is the table or the JSON)."""
    print(f"[bench_usage_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def seed_tenant(env: dict[str, str], slug: str, rows: int, *, adapters: int, seed: int) -> dict[str, Any]:
    """Create ``slug`` (a new key each run; its last line is the key) and seed it up to ``rows`` records over 365
    days ending now, then the gap from its newest record to now at the rate of the week before that record.

    Returns:
        ``{"key", "rows" (records now), "seeded" (added this run), "seed_s"}``.
    """
    key = _manage(env, "quiver_tenant_create", slug).splitlines()[-1]
    count = f"SELECT count(*) FROM gateway_usagerecord r JOIN tenants_tenant t ON t.id = r.tenant_id WHERE t.slug = '{slug}'"
    have = _sql(env, count)[0][0]
    t0, added = time.monotonic(), 0
    if have < rows:
        say(f"seeding {rows - have:,} records for {slug} (has {have:,})")
        _manage(env, "quiver_seed_usage", "--tenant", slug, "--rows", str(rows - have), "--days", "365",
                "--seed", str(seed), "--adapters", str(adapters))
        added += rows - have
    newest, week = _sql(env, f"SELECT max(created_at), count(*) FILTER (WHERE created_at >= (SELECT max(created_at) "
                             f"FROM ({count.replace('count(*)', 'r.created_at')}) x) - interval '7 days') "
                             f"FROM ({count.replace('count(*)', 'r.created_at')}) y")[0]
    gap_s = time.time() - newest.timestamp() if newest else 0.0
    if newest and gap_s > 60 and week:
        fill = max(1, round(week / (7 * 86400) * gap_s))
        say(f"seeding the {gap_s / 3600:.1f} h since {slug}'s newest record: {fill:,} records")
        _manage(env, "quiver_seed_usage", "--tenant", slug, "--rows", str(fill), "--days", f"{gap_s / 86400:.6f}",
                "--seed", str(seed + int(gap_s)), "--adapters", str(adapters))
        added += fill
    return {"key": key, "rows": _sql(env, count)[0][0], "seeded": added, "seed_s": round(time.monotonic() - t0, 1)}


def timed_get(http: httpx.Client, path: str) -> tuple[float, float, int]:
    """(ms to the first body byte, ms to the last, HTTP status) of one GET, the body read as it streams."""
    t0 = time.perf_counter()
    first = None
    with http.stream("GET", path) as resp:
        for _ in resp.iter_bytes(1 << 16):
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return ((first or end) - t0) * 1000, (end - t0) * 1000, resp.status_code


def postmaster(env: dict[str, str]) -> psutil.Process | None:
    """The PostgreSQL server's postmaster when it runs on this machine and its data folder is readable, else None
    (a remote ``DATABASE_URL``): its CPU and its children's are the database's side of a call's cost."""
    import psycopg

    try:
        with psycopg.connect(env["DATABASE_URL"]) as conn:  # a backend's parent is the postmaster
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            return psutil.Process(int(row[0])).parent() if row else None
    except (psycopg.Error, psutil.Error):
        return None


def cpu_s(proc: psutil.Process, *, with_children: bool) -> float:
    """CPU seconds (user + system) of ``proc``, with its reaped children's and, ``with_children``, its live
    children's (PostgreSQL backends and parallel workers are the postmaster's children)."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children() if with_children else ():
        try:
            c = child.cpu_times()
        except psutil.Error:  # exited between the listing and the read: counted as reaped next time
            continue
        total += c.user + c.system
    return total


def measure(clients: dict[str, dict[str, httpx.Client]], reps: int, webs: dict[str, psutil.Process],
            db: psutil.Process | None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{side: {page: {"p50_ms", "p99_ms", "first_byte_p50_ms", "first_byte_p99_ms", "cpu_p50_ms",
    "cpu_p99_ms", "n", "failures"}}}``; each round calls every page once, on every side in turn. ``cpu_*``: the
    web process's CPU plus the database server's (all its processes; None without ``db``) during the call, ms: what
    the call costs whatever the machine's load, which on a shared box makes the wall-time p99 mostly queueing."""
    samples: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        side: {p[0]: [] for p in PAGES} for side in clients}
    failures: dict[str, dict[str, int]] = {side: {p[0]: 0 for p in PAGES} for side in clients}
    for rep in range(reps):
        for name, who, path in PAGES:
            for side, http in clients.items():
                cpu0 = cpu_s(webs[side], with_children=False) + (cpu_s(db, with_children=True) if db else 0.0)
                first, last, status = timed_get(http[who], path)
                cpu1 = cpu_s(webs[side], with_children=False) + (cpu_s(db, with_children=True) if db else 0.0)
                if status == 200:
                    samples[side][name].append((first, last, (cpu1 - cpu0) * 1000))
                else:
                    failures[side][name] += 1
        say(f"round {rep + 1}/{reps} done")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for side, pages in samples.items():
        out[side] = {}
        for name, values in pages.items():
            firsts, lasts, cpus = ([v[i] for v in values] for i in range(3))
            out[side][name] = {"n": len(values), "failures": failures[side][name], "samples_ms": lasts,
                               **({"p50_ms": round(_percentile(lasts, 0.5), 1),
                                   "p99_ms": round(_percentile(lasts, 0.99), 1),
                                   "first_byte_p50_ms": round(_percentile(firsts, 0.5), 1),
                                   "first_byte_p99_ms": round(_percentile(firsts, 0.99), 1),
                                   "cpu_p50_ms": round(_percentile(cpus, 0.5), 1) if db else None,
                                   "cpu_p99_ms": round(_percentile(cpus, 0.99), 1) if db else None}
                                  if values else {})}
    return out


def fleet_api_p99(pages: dict[str, dict[str, Any]]) -> float | None:
    """``api_ms_p99`` as fleet_scale computes it: the p99 (ms) over every sample of its pages together."""
    values = [v for name in FLEET_PAGES if name in pages for v in pages[name]["samples_ms"]]
    return round(_percentile(values, 0.99), 1) if values else None


def table(report: dict[str, Any]) -> list[str]:
    """Markdown rows per page: wall ms p50 / p99 per side (export: first byte, then last byte), then CPU ms p50 /
    p99 per side (web process + database server)."""
    sides = list(report["results"])
    lines = ["| page | " + " | ".join(f"{s}: wall ms p50 / p99" for s in sides) + " | "
             + " | ".join(f"{s}: CPU ms p50 / p99" for s in sides) + " |", "|---|" + "---|" * 2 * len(sides)]
    for name, _, _ in PAGES:
        cells = []
        for side in sides:
            c = report["results"][side][name]
            if not c["n"]:
                cells.append(f"failed ({c['failures']})")
                continue
            text = f"{c['p50_ms']:,.1f} / {c['p99_ms']:,.1f}"
            if name.startswith("export"):
                text = f"first byte {c['first_byte_p50_ms']:,.1f} / {c['first_byte_p99_ms']:,.1f}; last " + text
            cells.append(text + (f" ({c['failures']} failed)" if c["failures"] else ""))
        for side in sides:
            c = report["results"][side][name]
            cells.append(f"{c['cpu_p50_ms']:,.1f} / {c['cpu_p99_ms']:,.1f}" if c.get("cpu_p50_ms") is not None else "—")
        lines.append(f"| {name}{' *' if name in FLEET_PAGES else ''} | " + " | ".join(cells) + " |")
    lines.append("| api_ms_p99 (the * pages together, as fleet_scale) | "
                 + " | ".join(f"{report['api_ms_p99'][s] or 0:,.1f}" for s in sides) + " |" + " |" * len(sides))
    return lines


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear scenario
    """Seed, start the web process(es), time every page, print the table (or one JSON object)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000, help="usage records of the busy tenant (seeded if fewer)")
    p.add_argument("--adapters", type=int, default=10, help="the busy tenant's adapters (Zipf over them)")
    p.add_argument("--other-tenants", type=int, default=4)
    p.add_argument("--other-rows", type=int, default=100_000, help="usage records of each other tenant")
    p.add_argument("--nodes", type=int, default=None,
                   help="registered nodes (the operator's nodes page; default 16, with --fleet 64)")
    p.add_argument("--fleet", action="store_true", help="seed bench_fleet_view's fleet and its last hour's usage")
    p.add_argument("--fleet-usage", type=int, default=12_000, help="--fleet: usage records over the last hour")
    p.add_argument("--only", default="", help="comma-separated parts of page names: time only those pages")
    p.add_argument("--reps", type=int, default=20, help="rounds of every page")
    p.add_argument("--before-tree", type=Path, default=None, help="older checkout to measure beside this one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    args.nodes = args.nodes or (64 if args.fleet else 16)
    if args.only:
        PAGES[:] = [page for page in PAGES if any(part in page[0] for part in args.only.split(","))]
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("run through ./scripts/bench_usage_scale (it starts PostgreSQL, Redis and SeaweedFS)")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-usage-scale-"))
    (workdir / "logs").mkdir()
    procs = Processes(workdir / "logs")
    password = secrets.token_urlsafe(18)
    env = bench_env()
    report: dict[str, Any] = {"reps": args.reps, "cores": os.cpu_count()}
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        stack.callback(procs.stop_all)
        migrate_with_base_model(env, workdir)
        base = _sql(env, "SELECT base_model_name FROM adapters_basemodel ORDER BY id LIMIT 1")[0][0]
        busy = seed_tenant(env, TENANT, args.rows, adapters=args.adapters, seed=args.seed)
        others = [seed_tenant(env, f"bench-other-{i}", args.other_rows, adapters=3, seed=args.seed + 1 + i)
                  for i in range(args.other_tenants)]
        report["tenant_rows"] = busy["rows"]
        report["seeded"] = busy["seeded"] + sum(o["seeded"] for o in others)
        if args.fleet:  # a fleet seeded once per database; its last hour's usage each run (the window moves)
            out = subprocess.run([sys.executable, "scripts/bench_fleet_view.py", "--seed-only", "--nodes",
                                  str(args.nodes), "--usage", str(args.fleet_usage), "--seed", str(args.seed)],
                                 cwd=REPO, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                raise SystemExit(f"bench_fleet_view --seed-only: exit {out.returncode}\n{out.stderr[-2000:]}")
            report["fleet"] = json.loads(out.stdout.strip().splitlines()[-1])
            say(f"fleet: {report['fleet']}")
        report["all_rows"] = _sql(env, "SELECT count(*) FROM gateway_usagerecord")[0][0]
        named = {r[0] for r in _sql(env, "SELECT name FROM gateway_node")}
        for i in range(1, 0 if args.fleet else args.nodes + 1):
            if f"bench-node-{i:03d}" not in named:
                _manage(env, "quiver_node_register", f"bench-node-{i:03d}", "--agent-url", f"http://127.0.0.1:{i}",
                        "--engine-url", f"http://127.0.0.1:{i}", "--base-model", base)
        _manage({**env, "QUIVER_USER_PASSWORD": password}, "quiver_user_create", OPERATOR, "--staff")
        webs = {"after": REPO, **({"before": args.before_tree.resolve()} if args.before_tree else {})}
        clients: dict[str, dict[str, httpx.Client]] = {}
        webs_cpu: dict[str, psutil.Process] = {}
        for side, tree in webs.items():
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with (workdir / "logs" / f"web-{side}.log").open("wb") as log:  # the older tree's code, from its folder
                proc = subprocess.Popen(web_argv("config.asgi:application", port), cwd=tree, env=env, stdout=log,
                                        stderr=subprocess.STDOUT)
            procs.procs.append((f"web-{side}", proc))
            procs.wait_http(f"web-{side}", f"{url}/healthz", 300)
            tenant = stack.enter_context(httpx.Client(base_url=url, timeout=900,
                                                      headers={"Authorization": f"Bearer {busy['key']}"}))
            operator = operator_client(url, password, username=OPERATOR)
            stack.callback(operator.close)
            operator.timeout = httpx.Timeout(900)
            clients[side] = {"tenant": tenant, "operator": operator}
            webs_cpu[side] = psutil.Process(proc.pid)
            for _, who, path in PAGES:  # imports, first connections, first plans: untimed
                timed_get(clients[side][who], path)
        clients = dict(sorted(clients.items(), reverse=True))  # before, then after, in every round
        report["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                          text=True).stdout.strip()
        report["results"] = measure(clients, args.reps, webs_cpu, postmaster(env))
    report["api_ms_p99"] = {side: fleet_api_p99(pages) for side, pages in report["results"].items()}
    report["load_avg"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"\nconsole pages at {report['tenant_rows']:,} usage records of {TENANT} ({report['all_rows']:,} in the table),"
          f" {args.nodes} nodes{' (bench_fleet_view fleet)' if args.fleet else ''}, {args.reps} rounds, {os.cpu_count()} cores, load avg {report['load_avg']}")
    print(f"after = this tree ({report['commit']})" + (f", before = {args.before_tree}" if args.before_tree else ""))
    print("\n".join(table(report)))
    slow = [n for n, c in report["results"]["after"].items()
            if not n.startswith("export") and (not c["n"] or c["p99_ms"] > TARGET_MS)]
    print(f"pages over {TARGET_MS:.0f} ms p99 (or failed): {', '.join(slow) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
