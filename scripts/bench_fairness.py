"""Benchmark fair sharing: a quiet tenant's streaming TTFT alone and while another tenant floods the gateway.

One CPU vLLM node (the tiny demo model), its node agent (publishing engine load for admission), the gateway
(uvicorn serving ``config.asgi``) and the internal listener, on PostgreSQL and Redis (started by
``devtools.services``). Two tenants: ``quiet`` without limits, ``flood`` with a requests-per-minute limit. In
alternating rounds the quiet tenant streams at a steady rate alone, then at the same rate while the flooder sends
open-loop at ``--flood-factor`` × its limit (default 6×). Printed: the quiet tenant's p50/p99 TTFT alone and under
the flood and the p99 ratio, the flooder's 200s and 429s (and how many 429s carried ``Retry-After``), every 5xx,
the gateway's admission counters from the internal ``/metrics``, and the load average.

The engine gets every core but one (``--engine-threads``; vLLM's ``VLLM_CPU_NUM_OF_RESERVED_CPU``): here the gateway
and both clients run on the engine's machine, which production's layout does not do (the gateway is its own
deployment). With the engine's OMP threads on both of 2 cores, every client or gateway wake-up stalled an engine step:
one run on 2026-12-05 measured the quiet tenant's p50 TTFT alone at 18.8 ms and the engine's inter-token latency at
8 ms with two threads, against 14.3 ms and 5 ms with one (the tiny model gains nothing from a second thread).

Targets (issue 7): quiet p99 TTFT under the flood ≤ 1.5 × solo; the flooder gets 429 with ``Retry-After``; zero 5xx.

Usage:
    ./scripts/bench_fairness [--rounds 2] [--seconds 30] [--quiet-rps 4] [--flood-rpm 300] [--flood-factor 6]
                             [--node-slots 8] [--slot-reserve 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import Processes, node_process_env  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from inference.node.launch import EngineConfig, engine_argv, engine_env  # noqa: E402

PY = sys.executable
PROMPT = "the cat sat on the mat and the dog ran to the"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Tally:
    """Outcomes of one tenant's requests: status counts, 429s with Retry-After, TTFTs (ms) of the 200s."""

    def __init__(self) -> None:
        self.status: Counter[int] = Counter()
        self.retry_after = 0
        self.ttft: list[float] = []
        self.errors: Counter[str] = Counter()
        self.phase_t0 = 0.0  # perf_counter at the start of the current phase
        self.when: list[tuple[float, float]] = []  # (TTFT ms, seconds into its phase) per 200

    def slowest(self, n: int = 5) -> str:
        """The ``n`` slowest TTFTs with when in their phase they were sent (tells bursts from steady noise)."""
        return ", ".join(f"{ms:.0f} ms @{at:.1f} s" for ms, at in sorted(self.when, reverse=True)[:n])


async def _stream(client: httpx.AsyncClient, key: str, body: dict[str, object], tally: Tally) -> None:
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
            tally.status[resp.status_code] += 1
            if resp.status_code == 429 and resp.headers.get("retry-after"):
                tally.retry_after += 1
            if resp.status_code != 200:
                raw = await resp.aread()
                try:
                    code = str(json.loads(raw)["error"]["code"])
                except (ValueError, KeyError, TypeError):
                    code = "?"
                tally.errors[f"{resp.status_code} {code}"] += 1
                return
            first = None
            async for line in resp.aiter_lines():
                if first is None and line.startswith("data:") and '"text"' in line:
                    first = (time.perf_counter() - t0) * 1000
                if '"error"' in line:
                    tally.errors["stream_error_event"] += 1
            if first is not None:
                tally.ttft.append(first)
                tally.when.append((first, t0 - tally.phase_t0))
    except httpx.HTTPError as exc:
        tally.errors[type(exc).__name__] += 1


async def _open_loop(client: httpx.AsyncClient, key: str, body: dict[str, object], rps: float, seconds: float,
                     tally: Tally) -> None:
    """Send at a fixed rate regardless of answers (a client that does not back off)."""
    tasks: list[asyncio.Task[None]] = []
    start = tally.phase_t0 = time.perf_counter()
    n = int(rps * seconds)
    for i in range(n):
        delay = start + i / rps - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_stream(client, key, body, tally)))
    await asyncio.gather(*tasks)


def _flood_process(web_url: str, key: str, body: dict[str, object], rps: float, seconds: float,
                   results: multiprocessing.Queue[Tally | str], go: Any) -> None:
    """The flooder's open loop in a process of its own: says ``ready`` through ``results``, starts on ``go``, and
    sends its tally back through ``results``. It runs at a lower CPU priority (nice 10): the flooder's clients are
    other machines in production, and here its ~30 requests/s would otherwise take CPU from the stack it measures."""
    os.nice(10)

    async def run() -> Tally:
        tally = Tally()
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=web_url, timeout=120, limits=limits) as client:
            results.put("ready")
            await asyncio.to_thread(go.wait)
            await _open_loop(client, key, body, rps, seconds, tally)
        return tally
    results.put(asyncio.run(run()))


async def _bench(web_url: str, quiet_key: str, flood_key: str, model: str, args: argparse.Namespace,
                 probes: list[tuple[str, tuple[str, ...], dict[str, str]]]) -> dict:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=256)
    quiet_body = {"model": model, "prompt": PROMPT, "max_tokens": args.quiet_tokens, "temperature": 0}
    flood_body = {"model": model, "prompt": PROMPT * 4, "max_tokens": args.flood_tokens, "temperature": 0,
                  "ignore_eos": True}
    solo, flooded, flood = Tally(), Tally(), Tally()
    windows: dict[str, list[tuple[float, float]]] = {"alone": [], "flood": []}
    flood_rps = args.flood_rpm / 60 * args.flood_factor
    async with httpx.AsyncClient(base_url=web_url, timeout=120, limits=limits) as client:
        await _open_loop(client, quiet_key, quiet_body, 4, 3, Tally())  # warm connections and caches
        for r in range(args.rounds):
            before = [await asyncio.to_thread(_histograms, *p) for p in probes]
            began = time.time()
            await _open_loop(client, quiet_key, quiet_body, args.quiet_rps, args.seconds, solo)
            windows["alone"].append((began, time.time()))
            after = [await asyncio.to_thread(_histograms, *p) for p in probes]
            where = "; ".join(_where(b, a) for b, a in zip(before, after, strict=True))
            print(f"round {r + 1}: solo done ({len(solo.ttft)} TTFTs): {where}", flush=True)
            # The flooder runs in its own process: in one event loop, parsing its ~2,000 stream lines a second
            # delayed the quiet client's reads and inflated the quiet TTFT the bench measures. Both start together
            # once it is ready (a spawn takes tens of seconds on a loaded box; starting the quiet phase meanwhile
            # measured part of it without a flood and let the flood straddle two rate-limit windows).
            ctx = multiprocessing.get_context("spawn")
            results: multiprocessing.Queue = ctx.Queue()
            go = ctx.Event()
            flooder = ctx.Process(target=_flood_process, args=(web_url, flood_key, flood_body, flood_rps,
                                                                args.seconds, results, go))
            flooder.start()
            assert await asyncio.to_thread(results.get) == "ready"
            await asyncio.sleep(61 - time.time() % 60)  # a fresh rate-limit window for each flood
            before = [await asyncio.to_thread(_histograms, *p) for p in probes]
            go.set()
            began = time.time()
            await _open_loop(client, quiet_key, quiet_body, args.quiet_rps, args.seconds, flooded)
            windows["flood"].append((began, time.time()))
            after = [await asyncio.to_thread(_histograms, *p) for p in probes]
            where = "; ".join(_where(b, a) for b, a in zip(before, after, strict=True))
            print(f"round {r + 1} flood phase, both tenants: {where}", flush=True)
            part = await asyncio.to_thread(results.get)
            await asyncio.to_thread(flooder.join)
            flood.status.update(part.status)
            flood.retry_after += part.retry_after
            flood.ttft.extend(part.ttft)
            flood.errors.update(part.errors)
            print(f"round {r + 1}: flood done ({len(flooded.ttft)} TTFTs; flooder {dict(flood.status)})", flush=True)
            await asyncio.sleep(2)
    return {"solo": solo, "flooded": flooded, "flood": flood, "flood_rps": flood_rps, "windows": windows}


def _gateway_ttfts(redis_url: str, tenant_id: int, windows: dict[str, list[tuple[float, float]]]) -> dict[str, list[float]]:
    """The quiet tenant's TTFTs as the gateway measured them (arrival → first token written), per phase, from its
    usage records (the Redis stream ``QUIVER_USAGE_STREAM``; no worker drains it here). Beside the client's figures
    they tell time spent in the gateway and engine from time spent in the client and the network."""
    import redis

    out: dict[str, list[float]] = {name: [] for name in windows}
    client = redis.Redis.from_url(redis_url)
    for _, fields in client.xrange(USAGE_STREAM):
        row = json.loads(fields[b"r"])
        if row["tenant_id"] != tenant_id or row["ttft_ms"] is None:
            continue
        for name, spans in windows.items():
            if any(a <= row["created_at"] <= b for a, b in spans):
                out[name].append(float(row["ttft_ms"]))
    return out


ENGINE_HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:time_to_first_token_seconds",
                     "vllm:request_prefill_time_seconds", "vllm:inter_token_latency_seconds")
GATEWAY_HISTOGRAMS = ("quiver_gateway_admission_wait_seconds",)


USAGE_STREAM = "quiver:usage"  # QUIVER_USAGE_STREAM in config/settings/base.py
SLOW_S = 0.06  # a bucket edge of vLLM's and the gateway's histograms


def _histograms(url: str, names: tuple[str, ...], headers: dict[str, str] | None = None) -> dict[str, list[float]]:
    """name → [sum, count, count at most ``SLOW_S``] over all label sets, from a Prometheus text page."""
    out = {n: [0.0, 0.0, 0.0] for n in names}
    for line in httpx.get(url, timeout=10, headers=headers).text.splitlines():
        for n in names:
            for i, suffix in enumerate(("_sum", "_count")):
                if line.startswith(n + suffix):
                    out[n][i] += float(line.rpartition(" ")[2])
            if line.startswith(n + "_bucket") and f'le="{SLOW_S}"' in line:
                out[n][2] += float(line.rpartition(" ")[2])
    return out


def _where(before: dict[str, list[float]], after: dict[str, list[float]]) -> str:
    """Mean and count of each histogram between two reads, and how many took longer than ``SLOW_S`` (engine stalls
    show as slow engine TTFTs; the quiet tenant's slow ones without them happened outside the engine)."""
    parts = []
    for name in before:
        total, n = after[name][0] - before[name][0], after[name][1] - before[name][1]
        slow = n - (after[name][2] - before[name][2])
        parts.append(f"{name.split(':')[-1]} mean {total / n * 1000:.0f} ms (n {n:.0f}, > {SLOW_S * 1000:.0f} ms "
                     f"{slow:.0f})" if n else f"{name} n 0")
    return "; ".join(parts)


def _admission_counters(internal_url: str) -> dict[str, float]:
    text = httpx.get(internal_url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("quiver_gateway_admission_total", "quiver_gateway_rate_limited_total")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run the rounds, print the figures. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="solo/flood rounds")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="length of each phase (30 s x 2 rounds x 4 req/s: 240 quiet TTFTs per phase, so the p99 is the 3rd slowest, not the 2nd)")
    parser.add_argument("--quiet-rps", type=float, default=4.0, help="the quiet tenant's request rate")
    parser.add_argument("--quiet-tokens", type=int, default=16, help="max_tokens of the quiet tenant's requests")
    parser.add_argument("--flood-rpm", type=int, default=300, help="the flooder's requests-per-minute limit")
    parser.add_argument("--flood-factor", type=float, default=6.0, help="the flood rate as a multiple of its limit")
    parser.add_argument("--flood-tokens", type=int, default=64, help="max_tokens of the flooder's requests")
    parser.add_argument("--node-slots", type=int, default=8,
                        help="QUIVER_ADMISSION_NODE_SLOTS for the gateway (0 = no running-slot budget)")
    parser.add_argument("--slot-reserve", type=int, default=2, help="QUIVER_ADMISSION_SLOT_RESERVE for the gateway")
    parser.add_argument("--engine-threads", type=int, default=max((os.cpu_count() or 1) - 1, 1),
                        help="the engine's OMP threads (default: every core but one; 0 = every core, as the node "
                             "launcher does); the rest of the cores are left to the gateway and the clients")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        raise SystemExit("run through ./scripts/bench_fairness (it starts PostgreSQL and Redis)")

    assets = ensure_demo_assets(REPO / ".cache" / "demo-assets")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-fair-"))
    (workdir / "logs").mkdir()
    (workdir / "metrics").mkdir()
    procs = Processes(workdir / "logs")
    engine_port, web_port, agent_port, internal_port = free_port(), free_port(), free_port(), free_port()
    web_url, internal_url = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{internal_port}"
    engine_url, agent_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{agent_port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "false",
        "DJANGO_LOG_LEVEL": "WARNING",
        "QUIVER_NODE_SECRET": os.urandom(32).hex(),
        "DJANGO_SECRET_KEY": os.urandom(32).hex(),
        "QUIVER_API_KEY_HMAC_KEY": os.urandom(32).hex(),
        "CELERY_TASK_ALWAYS_EAGER": "false",
    }
    web_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(workdir / "metrics"),
               "QUIVER_ADMISSION_NODE_SLOTS": str(args.node_slots),
               "QUIVER_ADMISSION_SLOT_RESERVE": str(args.slot_reserve)}
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        _manage(env, "migrate", "--noinput")
        _manage(env, "quiver_base_model_register", assets.served_name, str(assets.base_dir), "--max-lora-rank", "16")
        suffix = os.getpid()
        quiet_key = _manage(env, "quiver_tenant_create", f"quiet{suffix}", "--name", "Quiet").splitlines()[-1]
        flood_key = _manage(env, "quiver_tenant_create", f"flood{suffix}", "--name", "Flood").splitlines()[-1]
        _manage(env, "shell", "-c", f"from tenants.models import Tenant; "
                f"Tenant.objects.filter(slug='flood{suffix}').update(rpm_limit={args.flood_rpm})")
        node_env = dict(line.split("=", 1) for line in _manage(
            env, "quiver_node_register", "fair-node-1", "--agent-url", agent_url, "--engine-url", engine_url,
            "--base-model", assets.served_name).splitlines())
        node_key = node_env["QUIVER_NODE_KEY"]
        engine = EngineConfig.cpu_dev(assets.base_dir, assets.served_name, port=engine_port, api_key=node_key)
        engine_vars = engine_env(engine, node_process_env(env))
        if args.engine_threads:
            engine_vars["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(max((os.cpu_count() or 1) - args.engine_threads, 0))
        procs.start("vllm", engine_argv(engine, python=PY), engine_vars)
        procs.start("web", [PY, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                            str(web_port), "--log-level", "warning", "--no-access-log"], web_env)
        procs.start("internal", [PY, "-m", "uvicorn", "config.internal_asgi:application", "--host", "127.0.0.1",
                                 "--port", str(internal_port), "--log-level", "warning"], web_env)
        procs.start("agent", [PY, "-m", "uvicorn", "inference.node.agent:app", "--host", "127.0.0.1", "--port",
                              str(agent_port), "--log-level", "warning"], {
            **node_process_env(env), **node_env, "QUIVER_ENGINE_URL": engine.url,
            "QUIVER_BASE_MODEL": assets.served_name, "QUIVER_NODE_CACHE_DIR": str(workdir / "node-cache"),
            "QUIVER_AGENT_URL": agent_url, "QUIVER_CONTROL_URL": internal_url, "QUIVER_LOAD_REDIS_URL": env["REDIS_URL"],
            "QUIVER_HEARTBEAT_SECONDS": "2", "QUIVER_MAX_LORAS": "2", "QUIVER_MAX_CPU_LORAS": "4",
            "QUIVER_MAX_LORA_RANK": "16", "AWS_STORAGE_BUCKET_NAME": "quiver",
        })
        procs.wait_http("web", web_url + "/healthz", 600)  # slow under a shared CPU
        procs.wait_http("vllm", engine.url + "/health", 900)  # slow under a shared CPU
        procs.wait_http("agent", agent_url + "/healthz", 300)
        deadline = time.monotonic() + 60
        probe = {"model": assets.served_name, "prompt": "x", "max_tokens": 1}
        while httpx.post(web_url + "/v1/completions", json=probe, timeout=30,
                         headers={"Authorization": f"Bearer {quiet_key}"}).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the gateway never served the base model (no node heartbeat?)")
            time.sleep(0.5)
        load0 = os.getloadavg()
        print(f"quiet: {args.quiet_rps:g} req/s streaming, max_tokens {args.quiet_tokens}; flood: limit "
              f"{args.flood_rpm} rpm, sent at {args.flood_factor:g}x = {args.flood_rpm / 60 * args.flood_factor:.1f} "
              f"req/s, max_tokens {args.flood_tokens}; {args.rounds} rounds x {args.seconds:g} s per phase; node slots "
              f"{args.node_slots} (reserve {args.slot_reserve}); engine threads {args.engine_threads or 'all'}; "
              f"cores {os.cpu_count()}; load avg {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
        probes = [(engine.url + "/metrics", ENGINE_HISTOGRAMS, {"Authorization": f"Bearer {node_key}"}),
                  (internal_url + "/metrics", GATEWAY_HISTOGRAMS, {})]
        r = asyncio.run(_bench(web_url, quiet_key, flood_key, assets.served_name, args, probes))
        solo, flooded, flood = r["solo"], r["flooded"], r["flood"]
        fivexx = sum(n for t in (solo, flooded, flood) for s, n in t.status.items() if s >= 500)
        load1 = os.getloadavg()
        s99, f99 = _pct(solo.ttft, .99), _pct(flooded.ttft, .99)
        print(f"\n{'quiet tenant TTFT':<28} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
        print(f"{'  alone':<28} {len(solo.ttft):>5} {_pct(solo.ttft, .5):8.1f} {s99:8.1f}")
        print(f"{'  under the flood':<28} {len(flooded.ttft):>5} {_pct(flooded.ttft, .5):8.1f} {f99:8.1f}")
        print(f"p99 ratio (flood / alone): {f99 / s99:.2f}x   (goal <= 1.5x)")
        print(f"slowest quiet TTFTs (when in the phase): alone {solo.slowest()}; under the flood {flooded.slowest()}")
        quiet_id = int(_manage(env, "shell", "-c", f"from tenants.models import Tenant; "
                               f"print(Tenant.objects.get(slug='quiet{suffix}').pk)").splitlines()[-1])
        served = _gateway_ttfts(env["REDIS_URL"], quiet_id, r["windows"])
        g_alone, g_flood = served["alone"], served["flood"]
        print(f"the same, measured in the gateway (arrival to first token out): alone n {len(g_alone)} p50 "
              f"{_pct(g_alone, .5):.1f} p99 {_pct(g_alone, .99):.1f} max {max(g_alone, default=0):.0f} ms; under the "
              f"flood n {len(g_flood)} p50 {_pct(g_flood, .5):.1f} p99 {_pct(g_flood, .99):.1f} max "
              f"{max(g_flood, default=0):.0f} ms")
        print(f"quiet statuses: alone {dict(solo.status)}, under the flood {dict(flooded.status)}")
        print(f"flooder: sent {sum(flood.status.values())} at {r['flood_rps']:.1f} req/s; statuses "
              f"{dict(flood.status)}; 429s {flood.status[429]}, with Retry-After {flood.retry_after}")
        print(f"5xx responses: {fivexx}   (goal 0); non-200 answers, error events and transport errors by kind: "
              f"{dict(solo.errors + flooded.errors + flood.errors)}")
        print(f"gateway counters: {_admission_counters(internal_url)}")
        print(f"load avg: before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
              f"{load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
