"""Benchmark the usage API the console reads, at a year of one busy tenant's traffic (issue 31, point 4).

Seeds ``--rows`` usage records (default 10,000,000) for tenant ``bench-usage`` over 365 days with
``manage.py quiver_seed_usage`` (only the rows missing when the tenant already has some: point ``DATABASE_URL`` at
a kept database to reuse a seeding), starts one web process the way the demo does (uvicorn serving
``config.asgi``, ``demo.run.web_argv``) and calls it over real HTTP with the tenant's API key: each endpoint the
console or an export uses, for the last day, week, month (30 days) and year (365 days), ``--reps`` times each:

- ``summary``: ``GET /api/v1/usage?since=``; ``summary all-time``: ``GET /api/v1/usage`` (what the Usage page's
  totals send: no ``since``; the same call in every column);
- ``series``: ``GET /api/v1/usage/series?since=&bucket=hour`` (the Usage page's chart);
- ``traffic``: ``GET /api/v1/usage/traffic?since=`` (the Usage and Adapters pages' table);
- ``versions``: ``GET /api/v1/usage/versions?adapter=seed-0&since=`` (the adapter's serving panel);
- ``export``: ``GET /api/v1/usage?export=csv&since=``, read to its last byte;
- ``rollups``: ``GET /api/v1/usage/rollups?since=`` (no console page reads it; an API client's).

Prints one table (ms p50/p99 per endpoint and window; the HTTP status when not 200) and the tables' sizes on disk;
``--json`` prints one object instead (with each cell's body bytes). A cell whose first call takes longer than
``--cell-cap-s`` is called once. The web process's peak RSS after each endpoint is printed (the export must stream,
not hold its rows). The web process runs under uvicorn, not Django's test client, so the ASGI streaming path is
the one measured.

``--before-tree DIR`` (an older checkout, e.g. ``git archive <commit> | tar -x -C DIR``) starts a second web process
from that code on the same database, and every cell alternates its calls between the two, so both columns share the
machine's load: the table then shows ``before → after``. The schema is this tree's (migrated): the older code's
queries run on it unchanged.

Usage:
    ./scripts/bench_usage [--rows 10000000] [--reps 5] [--windows day,week,month,year] [--endpoints summary,…]
                          [--before-tree DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.run import Processes, web_argv  # noqa: E402
from devtools.proc import free_port  # noqa: E402

PY = sys.executable
TENANT = "bench-usage"
BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8}
WINDOWS = {"day": 1, "week": 7, "month": 30, "year": 365}
ENDPOINTS = {
    "summary": "/api/v1/usage?since={since}",
    "summary all-time": "/api/v1/usage",
    "series": "/api/v1/usage/series?since={since}&bucket=hour",
    "traffic": "/api/v1/usage/traffic?since={since}",
    "versions": "/api/v1/usage/versions?adapter=seed-0&since={since}",
    "export": "/api/v1/usage?export=csv&since={since}",
    "rollups": "/api/v1/usage/rollups?since={since}",  # last: its year answer grows the process by GBs
}
TARGET_MS = 1000.0


def bench_env() -> dict[str, str]:
    """The benchmark's environment for ``manage.py`` and the web process: this one's (``DATABASE_URL``...) with the
    local settings, no debug, warnings only, and fresh secrets."""
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false",
            "DJANGO_LOG_LEVEL": "WARNING", "QUIVER_NODE_SECRET": os.urandom(32).hex(),
            "DJANGO_SECRET_KEY": os.urandom(32).hex(), "QUIVER_API_KEY_HMAC_KEY": os.urandom(32).hex()}


def migrate_with_base_model(env: dict[str, str], workdir: Path) -> None:
    """Migrate, and register ``bench-base`` (an 8B Llama's ``config.json``, :data:`BASE_CONFIG`, written under
    ``workdir/base``) unless a base model is registered already. Raises SystemExit when a command fails."""
    _manage(env, "migrate", "--noinput")
    if not _sql(env, "SELECT 1 FROM adapters_basemodel LIMIT 1"):
        (workdir / "base").mkdir()
        (workdir / "base" / "config.json").write_text(json.dumps(BASE_CONFIG))
        _manage(env, "quiver_base_model_register", "bench-base", str(workdir / "base"))


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return out.stdout.strip()


def _sql(env: dict[str, str], query: str) -> list[tuple[Any, ...]]:
    """One query on the benchmark's database (psycopg, outside Django)."""
    import psycopg

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(query)  # type: ignore[arg-type]  # the benchmark's own literal queries
        return cur.fetchall() if cur.description else []


def _percentile(values: list[float], fraction: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * fraction
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _call(http: httpx.Client, path: str) -> tuple[float, int, int]:
    """(ms to the last byte, status, body bytes) of one GET, the body read as it streams."""
    t0 = time.perf_counter()
    size = 0
    with http.stream("GET", path) as resp:
        for chunk in resp.iter_bytes(1 << 16):
            size += len(chunk)
    return (time.perf_counter() - t0) * 1000, resp.status_code, size


def _measure(clients: dict[str, httpx.Client], endpoints: list[str], windows: list[str], reps: int, cap_s: float,
             pids: dict[str, int]) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, float]]]:
    """``{side: {endpoint: {window: {"p50_ms", "p99_ms", "n", "status", "bytes"}}}}`` (sides: ``after``, and
    ``before`` with ``--before-tree``; each call alternates between them) and each web process's peak RSS (MiB)
    after each endpoint."""
    out: dict[str, dict[str, dict[str, Any]]] = {side: {} for side in clients}
    rss: dict[str, dict[str, float]] = {side: {} for side in clients}
    now = time.time()
    for name in endpoints:
        for window in windows:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - WINDOWS[window] * 86400))
            path = ENDPOINTS[name].format(since=since)
            times: dict[str, list[float]] = {side: [] for side in clients}
            last: dict[str, tuple[int, int]] = {}
            for _ in range(reps):
                for side, http in clients.items():
                    ms, status, size = _call(http, path)
                    times[side].append(ms)
                    last[side] = (status, size)
                if any(t[-1] > cap_s * 1000 or last[side][0] != 200 for side, t in times.items()):
                    break
            for side in clients:
                cell = out[side].setdefault(name, {})[window] = {
                    "p50_ms": round(_percentile(times[side], 0.5), 1), "p99_ms": round(_percentile(times[side], 0.99), 1),
                    "n": len(times[side]), "status": last[side][0], "bytes": last[side][1]}
                print(f"  {side:>6} {name:>16} {window:>5}: p50 {cell['p50_ms']:9.1f} ms, p99 {cell['p99_ms']:9.1f} ms, "
                      f"n={cell['n']}, HTTP {cell['status']}, {cell['bytes']} B", file=sys.stderr, flush=True)
        for side, pid in pids.items():
            rss[side][name] = round(_peak_rss_mib(pid), 1)
    return out, rss


def _sizes(env: dict[str, str]) -> dict[str, int]:
    rows = _sql(env, "SELECT c, pg_total_relation_size(c), pg_relation_size(c), pg_indexes_size(c) FROM "
                     "unnest(ARRAY['gateway_usagerecord', 'gateway_usagerollup', 'metering_usagehour']) AS c")
    return {f"{name}_{what}": int(v) for name, total, heap, idx in rows
            for what, v in (("total_bytes", total), ("heap_bytes", heap), ("index_bytes", idx))}


def _cell(c: dict[str, Any]) -> str:
    text = f"{c['p50_ms']:,.0f} / {c['p99_ms']:,.0f}"
    if c["status"] != 200:
        return text + f" (HTTP {c['status']})"
    return text + (" (1 call)" if c["n"] == 1 else "")


def _table(results: dict[str, dict[str, dict[str, Any]]], windows: list[str]) -> str:
    """Markdown: one row per endpoint, ``p50 / p99`` per window (``before → after`` when both were measured)."""
    lines = ["ms p50 / p99 to the last byte" + (" (before → after)" if "before" in results else ""),
             f"| endpoint | {' | '.join(windows)} |", f"|---|{'---|' * len(windows)}"]
    for name, cells in results["after"].items():
        shown = [(_cell(results["before"][name][w]) + " → " if "before" in results else "") + _cell(cells[w])
                 for w in windows]
        lines.append(f"| {name} | {' | '.join(shown)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Seed, start the web process, time every endpoint and window, print the table (or one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="usage records of the tenant (seeded if fewer)")
    parser.add_argument("--reps", type=int, default=5, help="calls per endpoint and window")
    parser.add_argument("--windows", default="day,week,month,year", help="comma-separated of day, week, month, year")
    parser.add_argument("--cell-cap-s", type=float, default=20.0, help="call a cell once when its first call is slower")
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS), help=f"comma-separated of {', '.join(ENDPOINTS)}")
    parser.add_argument("--before-tree", type=Path, default=None, help="older checkout to measure beside this one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("run through ./scripts/bench_usage (it starts PostgreSQL, Redis and SeaweedFS)")
    windows = [w for w in args.windows.split(",") if w]
    endpoints = [e for e in args.endpoints.split(",") if e]
    if unknown := (set(windows) - set(WINDOWS)) | (set(endpoints) - set(ENDPOINTS)):
        raise SystemExit(f"unknown {sorted(unknown)}; windows are {list(WINDOWS)}, endpoints {list(ENDPOINTS)}")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-usage-"))
    (workdir / "logs").mkdir()
    procs = Processes(workdir / "logs")
    port = free_port()
    env = bench_env()
    report: dict[str, Any] = {"rows": args.rows, "reps": args.reps, "cores": os.cpu_count()}
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        stack.callback(procs.stop_all)
        migrate_with_base_model(env, workdir)
        key = _manage(env, "quiver_tenant_create", TENANT).splitlines()[-1]
        have = _sql(env, f"SELECT count(*) FROM gateway_usagerecord r JOIN tenants_tenant t ON t.id = r.tenant_id "
                         f"WHERE t.slug = '{TENANT}'")[0][0]
        if have < args.rows:
            t0 = time.monotonic()
            print(f"seeding {args.rows - have:,} usage records (have {have:,})", file=sys.stderr, flush=True)
            _manage(env, "quiver_seed_usage", "--tenant", TENANT, "--rows", str(args.rows - have), "--days", "365",
                    "--seed", str(args.seed))
            report["seed_s"] = round(time.monotonic() - t0, 1)
        report["tenant_rows"] = max(have, args.rows)
        report["all_rows"] = _sql(env, "SELECT count(*) FROM gateway_usagerecord")[0][0]
        webs = {"after": (REPO, port)}
        if args.before_tree:
            webs["before"] = (args.before_tree.resolve(), free_port())
        clients: dict[str, httpx.Client] = {}
        pids: dict[str, int] = {}
        for side, (tree, side_port) in webs.items():
            url = f"http://127.0.0.1:{side_port}"
            with (workdir / "logs" / f"web-{side}.log").open("wb") as log:  # the older tree's code, from its folder
                proc = subprocess.Popen(web_argv("config.asgi:application", side_port), cwd=tree, env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
            procs.procs.append((f"web-{side}", proc))
            procs.wait_http(f"web-{side}", f"{url}/healthz", 300)
            clients[side] = stack.enter_context(httpx.Client(base_url=url, timeout=900,
                                                             headers={"Authorization": f"Bearer {key}"}))
            clients[side].get("/api/v1/usage?since=1m").raise_for_status()  # imports, first connection: untimed
            pids[side] = proc.pid
        report["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                          text=True).stdout.strip()
        clients = dict(sorted(clients.items(), reverse=True))  # before, then after, in every cell
        report["results"], report["peak_rss_mib_after"] = _measure(clients, endpoints, windows, args.reps,
                                                                   args.cell_cap_s, pids)
        report["sizes"] = _sizes(env)
    report["load_avg"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"\nusage API at {report['tenant_rows']:,} rows of tenant {TENANT} ({report['all_rows']:,} in the table), "
          f"{args.reps} calls per cell, {os.cpu_count()} cores, load avg {report['load_avg']}")
    print(f"after = this tree ({report['commit']})" + (f", before = {args.before_tree}" if args.before_tree else ""))
    print(_table(report["results"], windows))
    print("on disk: " + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in report["sizes"].items()))
    for side, rss in report["peak_rss_mib_after"].items():
        print(f"{side}: web process peak RSS after each endpoint, MiB: "
              + ", ".join(f"{k} {v:,.0f}" for k, v in rss.items()))
    slow = [f"{n} {w}" for n, cells in report["results"]["after"].items() if n not in ("export", "rollups")
            for w, c in cells.items() if c["p99_ms"] > TARGET_MS or c["status"] != 200]
    print(f"page calls over {TARGET_MS:.0f} ms p99 (or not 200): {', '.join(slow) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
