"""Benchmark the gateway against the engine it fronts: the same requests straight to vLLM and through Quiver.

One CPU vLLM node (the tiny demo model), its node agent, and the gateway (uvicorn serving ``config.asgi``) on
PostgreSQL and Redis (started by ``devtools.services`` when absent). For 1-token completions of the base model
and for streaming time to first token, sequential and at concurrency 16 and 64, it prints p50/p99 latency and
requests/s for both paths, the milliseconds the gateway adds and the throughput ratio. Sequential scenarios
interleave the two paths request by request; the concurrent ones alternate direct/gateway in rounds; so machine
noise hits both alike (c=1 requests/s is 1 / mean latency). The last column is the gateway process's own CPU
time per request (user + system, from ``/proc``): unlike wall-clock figures it does not grow when other work
competes for the cores.

Targets (issue 7): added ≤ 2 ms p50 and ≤ 10 ms p99 on 1-token completions; throughput at concurrency 16 ≥ 0.6×.
The rows marked TPM call the gateway with a key of a tenant under a tokens-per-minute limit: each prompt is then
counted before admission (in the gateway with the base model's tokenizer, a chat with its chat template too, once
loaded; by the engine's ``/tokenize`` before), and issue 30 keeps the same ≤ 2 ms goal for them. The chat rows are
1-token chat completions of one user message.

Then, with a client we did not write (vLLM's own ``vllm bench serve``, random dataset 32 tokens in / 16 out,
``--ignore-eos``, the three demo adapters assigned round-robin, 240 prompts), the same comparison with mixed
adapters at concurrency 1 and 16: TTFT p50 and request rate, straight to vLLM (the adapters by their served names)
and through the gateway (by their tenant-facing names), the two paths alternating, two rounds. Targets (issue 30):
TTFT p50 added ≤ 2 ms and ≥ 0.95× the engine's request rate at concurrency 1.

Usage:
    ./scripts/bench_gateway [--requests 300] [--rounds 2] [--gateway-workers 1] [--profile out.txt]
                            [--only-mixed] [--mixed-prompts 240]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import Processes, node_process_env, web_argv  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from inference.node.launch import EngineConfig, engine_argv, engine_env  # noqa: E402

PY = sys.executable
PROMPT = "the cat sat on the"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _completion(client: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    t0 = time.perf_counter()
    async with client.post(url, json=body) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {data[:300]!r}")
    return (time.perf_counter() - t0) * 1000


async def _ttft(client: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    t0 = time.perf_counter()
    first: float | None = None
    async with client.post(url, json={**body, "stream": True}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if first is None and line.startswith(b"data:") and b'"text"' in line:
                first = (time.perf_counter() - t0) * 1000
    if first is None:
        raise RuntimeError(f"{url}: stream without a token")
    return first


async def _run(call: Callable[[], Awaitable[float]], n: int, concurrency: int) -> tuple[list[float], float]:
    """``n`` calls from ``concurrency`` workers; returns (latencies ms, requests/s)."""
    latencies: list[float] = []
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            latencies.append(await call())

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, n / (time.perf_counter() - t0)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` and their children so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    family = set(pids)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) in family:  # ppid
            family.add(int(stat.parent.name))
    total = 0.0
    for pid in family:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _bench(direct: tuple[str, str], gateway: tuple[str, str], model: str, args: argparse.Namespace,
                 gateway_pids: list[int], gateway_tpm: tuple[str, str]) -> dict:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    stream_body = {**body, "max_tokens": 4}
    chat_body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1, "temperature": 0}
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    # aiohttp (C parser) rather than httpx: on 2 cores the client's own CPU competes with both paths' servers.
    # Keep-alive below the servers' 5 s (uvicorn's default), so no request reuses a connection being closed.
    clients = {
        name: aiohttp.ClientSession(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=120),
            connector=aiohttp.TCPConnector(limit=128, keepalive_timeout=4.0), cookie_jar=aiohttp.DummyCookieJar())
        for name, (base, key) in {"direct": direct, "gateway": gateway, "gateway_tpm": gateway_tpm}.items()
    }
    # (kind, concurrency, the gateway path's client): "gateway_tpm" is a key of a tenant under a TPM limit, so
    # each request's prompt is counted before it is admitted (issue 30): in the gateway with the base model's
    # tokenizer and chat template once loaded, else by the engine's /tokenize.
    scenarios = ([("completion", c, "gateway") for c in (1, 16, 64)] + [("completion", 1, "gateway_tpm")]
                 + [("ttft", c, "gateway") for c in (1, 16, 64)] + [("ttft", 1, "gateway_tpm")]
                 + [("chat", 1, "gateway"), ("chat", 1, "gateway_tpm")])
    try:
        for client in clients.values():  # warm connections and both code paths
            await _run(lambda c=client: _completion(c, "/v1/completions", body), 50, 8)
            await _run(lambda c=client: _ttft(c, "/v1/completions", stream_body), 20, 4)
        for kind, conc, via in scenarios:
            label = f"{kind} c={conc}" + (" TPM" if via == "gateway_tpm" else "")
            paths = {"direct": clients["direct"], "gateway": clients[via]}
            results[label] = {"direct": {"lat": [], "rps": []}, "gateway": {"lat": [], "rps": []}}
            n = max(args.requests, conc * 4)
            if conc == 1:
                # Sequential: the two paths take turns request by request (who goes first alternating), so drift
                # of the machine's speed between blocks of requests cannot open or close the gap between them.
                calls = {path: _call_for(kind, client, chat_body if kind == "chat" else body, stream_body)
                         for path, client in paths.items()}
                for _ in range(args.rounds):
                    cpu0 = _cpu_s(gateway_pids)  # over the round: its background work during direct turns too
                    for i in range(n):
                        for path in (("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")):
                            results[label][path]["lat"].append(await calls[path]())
                    results[label]["gateway"].setdefault("cpu_ms", []).append((_cpu_s(gateway_pids) - cpu0) * 1000 / n)
                    for path in paths:
                        recent = results[label][path]["lat"][-n:]
                        results[label][path]["rps"].append(1000 * len(recent) / sum(recent))
                print(_row(label, results[label]), flush=True)
                continue
            for _ in range(args.rounds):
                for path, client in paths.items():
                    if kind == "completion":
                        call = lambda c=client: _completion(c, "/v1/completions", body)  # noqa: E731
                    else:
                        call = lambda c=client: _ttft(c, "/v1/completions", stream_body)  # noqa: E731
                    cpu0 = _cpu_s(gateway_pids)
                    lat, rps = await _run(call, n, conc)
                    results[label][path]["lat"] += lat
                    results[label][path]["rps"].append(rps)
                    if path == "gateway":
                        results[label][path].setdefault("cpu_ms", []).append((_cpu_s(gateway_pids) - cpu0) * 1000 / n)
            print(_row(label, results[label]), flush=True)
    finally:
        for client in clients.values():
            await client.close()
    return results


def _call_for(kind: str, client: aiohttp.ClientSession, body: dict[str, object],
              stream_body: dict[str, object]) -> Callable[[], Awaitable[float]]:
    if kind == "chat":
        return lambda: _completion(client, "/v1/chat/completions", body)
    if kind == "completion":
        return lambda: _completion(client, "/v1/completions", body)
    return lambda: _ttft(client, "/v1/completions", stream_body)


def _row(label: str, r: dict[str, dict[str, list[float]]]) -> str:
    d, g = r["direct"], r["gateway"]
    dp50, dp99, gp50, gp99 = _pct(d["lat"], .5), _pct(d["lat"], .99), _pct(g["lat"], .5), _pct(g["lat"], .99)
    drps, grps = statistics.mean(d["rps"]), statistics.mean(g["rps"])
    cpu = statistics.mean(g.get("cpu_ms", [0.0]))
    return (f"{label:<16} {dp50:8.2f} {dp99:8.2f} {drps:8.1f} | {gp50:8.2f} {gp99:8.2f} {grps:8.1f} | "
            f"{gp50 - dp50:+7.2f} {gp99 - dp99:+7.2f} {grps / drps:6.2f}x | {cpu:6.2f}")


HEADER = (f"{'scenario':<16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} | {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} | "
          f"{'+p50':>7} {'+p99':>7} {'ratio':>7} | {'gw CPU':>6}\n{'':<16} {'--- straight to vLLM ---':^26} | "
          f"{'--- through the gateway ---':^26} | {'--- added ---':^23} | ms/req")


VLLM_BENCH = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("QUIVER_RESULT " + json.dumps({k: result.get(k) for k in ("median_ttft_ms", "p99_ttft_ms", "request_throughput",
                                                              "completed", "failed")}))
"""


def _vllm_bench(base_url: str, key: str, model: str, tokenizer: Path, loras: list[str], concurrency: int,
                prompts: int, env: dict[str, str]) -> dict[str, float]:
    """One ``vllm bench serve`` run (vLLM's own client) against ``base_url``; its TTFT and request-rate figures."""
    argv = [PY, "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base_url, "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", "32",
            "--random-output-len", "16", "--ignore-eos", "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--lora-modules", *loras, "--lora-assignment", "round-robin",
            "--seed", "1", "--disable-tqdm"]
    out = subprocess.run(argv, cwd=REPO, env={**env, "OPENAI_API_KEY": key}, capture_output=True, text=True,
                         timeout=1800)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("QUIVER_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"vllm bench serve failed: {out.stdout[-2000:]} {out.stderr[-3000:]}")
    result = json.loads(line.split(" ", 1)[1])
    if result.get("failed"):
        raise RuntimeError(f"vllm bench serve: {result['failed']} requests failed against {base_url}")
    return result


def _sums(url: str, key: str, families: tuple[str, ...]) -> dict[str, float]:
    """The ``_sum`` and ``_count`` samples of the histograms ``families`` at ``url`` (a Prometheus ``/metrics``; every
    label set added up): ``{"<family>_sum": seconds, "<family>_count": observations}``."""
    text = httpx.get(url, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in families:
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


ENGINE_TTFT = "vllm:time_to_first_token_seconds"
TO_ENGINE = "quiver_gateway_time_to_engine_seconds"


def _mean_ms(before: dict[str, float], after: dict[str, float], family: str) -> float:
    count = after.get(f"{family}_count", 0.0) - before.get(f"{family}_count", 0.0)
    return (after.get(f"{family}_sum", 0.0) - before.get(f"{family}_sum", 0.0)) / count * 1000 if count else float("nan")


def _mixed(engine: tuple[str, str], gateway: tuple[str, str], floor: str, model: str, tokenizer: Path,
           names: dict[str, str], args: argparse.Namespace, env: dict[str, str],
           gateway_metrics: str) -> dict[str, dict[str, list]]:
    """Mixed adapters through vLLM's client, concurrency 1 and 16: straight to the engine, through the gateway and
    through a bare pass-through (``devtools.passthrough``, the floor of any extra hop here), the three in a rotating
    order per round. Prints the gateway's row, then the pass-through's, then where the time went: the engine's own
    TTFT (vLLM's ``time_to_first_token_seconds``, arrival in the engine to the first token) on each path, and the
    gateway's own time before it calls the engine (``quiver_gateway_time_to_engine_seconds``, read from
    ``gateway_metrics``, the internal listener's ``/metrics``)."""
    rows: dict[str, dict[str, list]] = {}
    for conc in (1, 16):
        label = f"mixed vllm c={conc}"
        rows[label] = {"direct": [], "gateway": [], "passthrough": []}
        spent: dict[str, list[float]] = {"direct": [], "gateway": [], "passthrough": [], "to_engine": []}
        for round_ in range(args.rounds):
            paths = ["direct", "gateway", "passthrough"]
            for path in paths[round_ % 3:] + paths[:round_ % 3]:
                base, key = {"direct": engine, "gateway": gateway, "passthrough": (floor, "-")}[path]
                loras = list(names.values()) if path == "direct" else list(names)
                e0, g0 = _sums(engine[0] + "/metrics", engine[1], (ENGINE_TTFT,)), _sums(gateway_metrics, "",
                                                                                        (TO_ENGINE,))
                rows[label][path].append(_vllm_bench(base, key, model, tokenizer, loras, conc, args.mixed_prompts,
                                                     env))
                spent[path].append(_mean_ms(e0, _sums(engine[0] + "/metrics", engine[1], (ENGINE_TTFT,)),
                                            ENGINE_TTFT))
                if path == "gateway":
                    spent["to_engine"].append(_mean_ms(g0, _sums(gateway_metrics, "", (TO_ENGINE,)), TO_ENGINE))
        rows[label]["spent_ms"] = [{k: statistics.mean(v) for k, v in spent.items()}]
        d = rows[label]["direct"]
        dt = statistics.mean(r["median_ttft_ms"] for r in d)
        dr = statistics.mean(r["request_throughput"] for r in d)
        dp = statistics.mean(r["p99_ttft_ms"] for r in d)
        for path, shown in (("gateway", label), ("passthrough", f"  bare hop c={conc}")):
            g = rows[label][path]
            gt = statistics.mean(r["median_ttft_ms"] for r in g)
            gr = statistics.mean(r["request_throughput"] for r in g)
            gp = statistics.mean(r["p99_ttft_ms"] for r in g)
            print(f"{shown:<16} {dt:8.2f} {dp:8.2f} {dr:8.1f} | {gt:8.2f} {gp:8.2f} {gr:8.1f} | "
                  f"{gt - dt:+7.2f} {gp - dp:+7.2f} {gr / dr:6.2f}x |  (TTFT)", flush=True)
        at = rows[label]["spent_ms"][0]
        print(f"  where, mean ms: engine's own TTFT straight {at['direct']:.2f}, via the gateway {at['gateway']:.2f}, "
              f"via the bare hop {at['passthrough']:.2f}; the gateway's own time before the engine call "
              f"{at['to_engine']:.2f}", flush=True)
    return rows


def _adapters(web_url: str, api_key: str, assets: object, env: dict[str, str]) -> dict[str, str]:
    """Upload the demo adapters through the public API (validated and warmed inline: eager tasks), and return
    each tenant-facing name with its served name (the engine's ``lora_name``)."""
    from demo.api_client import upload_adapter, wait_validated

    names: dict[str, str] = {}
    with httpx.Client(base_url=web_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300) as api:
        for task, folder in assets.adapters.items():  # type: ignore[attr-defined]
            version = upload_adapter(api, task, folder, base_model=assets.served_name)  # type: ignore[attr-defined]
            body = wait_validated(api, task, version["number"])
            if body["status"] != "ready":
                raise SystemExit(f"demo adapter {task} was rejected: {body.get('report')}")
            names[task] = ""
    # Served names are the platform's, never shown to tenants: read them as the operator would.
    shown = _manage(env, "shell", "-c", "from adapters_app.models import AdapterVersion as V; import json; "
                    "print(json.dumps({v.adapter.name: v.served_name for v in V.objects.filter(status='ready')}))")
    served = json.loads(shown.splitlines()[-1])
    return {task: served[task] for task in names}


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Start the stack, run every scenario, print the side-by-side table. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per scenario and path, per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating direct/gateway rounds per scenario")
    parser.add_argument("--gateway-workers", type=int, default=1, help="uvicorn --workers for the gateway")
    parser.add_argument("--profile", type=Path, help="run the gateway under py-spy and write its report here")
    parser.add_argument("--json", action="store_true", help="also print the raw figures as one JSON object")
    parser.add_argument("--only-mixed", action="store_true", help="run only the mixed-adapter vLLM-client scenarios")
    parser.add_argument("--mixed-prompts", type=int, default=240, help="prompts per vllm bench serve run")
    parser.add_argument("--engine-threads", type=int, default=0,
                        help="OMP threads of the engine (default: every core, vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU=0); "
                        "fewer leave cores to the gateway, as a GPU node does")
    parser.add_argument("--serve", type=Path, help="start the stack and upload the demo adapters, write its URLs, keys "
                        "and adapter names to this JSON file and wait for Ctrl-C instead of benchmarking (for "
                        "profiling by hand)")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        raise SystemExit("run through ./scripts/bench_gateway (it starts PostgreSQL and Redis)")

    assets = ensure_demo_assets(REPO / ".cache" / "demo-assets")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-gw-"))
    (workdir / "logs").mkdir()
    procs = Processes(workdir / "logs")
    engine_port, web_port, agent_port, internal_port = free_port(), free_port(), free_port(), free_port()
    web_url = f"http://127.0.0.1:{web_port}"
    engine_url, agent_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{agent_port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "false",
        "DJANGO_LOG_LEVEL": "WARNING",
        "QUIVER_NODE_SECRET": os.urandom(32).hex(),
        "DJANGO_SECRET_KEY": os.urandom(32).hex(),
        "QUIVER_API_KEY_HMAC_KEY": os.urandom(32).hex(),
        # Uploads validate and warm inline (no worker process): the mixed-adapter scenarios need the demo adapters.
        "CELERY_TASK_ALWAYS_EAGER": "true",
    }
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        _manage(env, "migrate", "--noinput")
        _manage(env, "quiver_base_model_register", assets.served_name, str(assets.base_dir), "--max-lora-rank", "16")
        api_key = _manage(env, "quiver_tenant_create", f"bench{os.getpid()}", "--name", "Bench").splitlines()[-1]
        tpm_slug = f"bench{os.getpid()}-tpm"
        tpm_key = _manage(env, "quiver_tenant_create", tpm_slug, "--name", "Bench TPM").splitlines()[-1]
        # A limit no run reaches: what it costs is the prompt's real token count on every request.
        _manage(env, "shell", "-c", "from tenants.models import Tenant; "
                f"Tenant.objects.filter(slug='{tpm_slug}').update(tpm_limit=1_000_000_000)")
        node_env = dict(line.split("=", 1) for line in _manage(
            env, "quiver_node_register", "bench-node-1", "--agent-url", agent_url, "--engine-url", engine_url,
            "--base-model", assets.served_name).splitlines())
        node_key = node_env["QUIVER_NODE_KEY"]
        engine = EngineConfig.cpu_dev(assets.base_dir, assets.served_name, port=engine_port, api_key=node_key)
        engine_vars = engine_env(engine, node_process_env(env))
        if args.engine_threads:
            engine_vars["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(max((os.cpu_count() or 1) - args.engine_threads, 0))
        procs.start("vllm", engine_argv(engine, python=PY), engine_vars)
        # As the demo serves it (header/body read deadlines, no proxy headers), plus workers and no access log.
        web = [*web_argv("config.asgi:application", web_port), "--no-access-log", "--workers",
               str(args.gateway_workers)]
        if args.profile:
            spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
            web = [spy, "record", "-o", str(args.profile), "-f", "raw", "--subprocesses", "--", *web]
        # One multiprocess metrics folder for the gateway and the internal listener that exposes its figures.
        (workdir / "metrics").mkdir()
        web_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(workdir / "metrics")}
        web_proc = procs.start("web", web, web_env)
        procs.start("internal", [PY, "-m", "uvicorn", "config.internal_asgi:application", "--host", "127.0.0.1",
                                 "--port", str(internal_port), "--log-level", "warning"], web_env)
        procs.start("agent", [PY, "-m", "uvicorn", "inference.node.agent:app", "--host", "127.0.0.1", "--port",
                              str(agent_port), "--log-level", "warning"], {
            **node_process_env(env), **node_env, "QUIVER_ENGINE_URL": engine.url,
            "QUIVER_BASE_MODEL": assets.served_name, "QUIVER_NODE_CACHE_DIR": str(workdir / "node-cache"),
            "QUIVER_AGENT_URL": agent_url, "QUIVER_CONTROL_URL": f"http://127.0.0.1:{internal_port}",
            "QUIVER_HEARTBEAT_SECONDS": "2", "QUIVER_MAX_LORAS": "2", "QUIVER_MAX_CPU_LORAS": "4",
            "QUIVER_MAX_LORA_RANK": "16", "AWS_STORAGE_BUCKET_NAME": "quiver",
        })
        procs.wait_http("web", web_url + "/healthz", 60)
        procs.wait_http("vllm", engine.url + "/health", 900)  # slow under a shared CPU
        procs.wait_http("agent", f"http://127.0.0.1:{agent_port}/healthz", 60)
        deadline = time.monotonic() + 60
        probe = {"model": assets.served_name, "prompt": "x", "max_tokens": 1}
        while httpx.post(web_url + "/v1/completions", json=probe, timeout=30,
                         headers={"Authorization": f"Bearer {api_key}"}).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the gateway never served the base model (no node heartbeat?)")
            time.sleep(0.5)
        if args.serve:
            names = _adapters(web_url, api_key, assets, env)
            args.serve.write_text(json.dumps({"gateway": web_url, "engine": engine.url, "api_key": api_key,
                                              "node_key": node_key, "model": assets.served_name,
                                              "adapters": names, "logs": str(workdir / "logs")}))
            print(f"serving; details in {args.serve}; Ctrl-C (SIGINT) stops", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
        print(f"gateway workers: {args.gateway_workers}; {args.requests} requests x {args.rounds} rounds per "
              f"scenario and path; cores: {os.cpu_count()}; load avg: {os.getloadavg()[0]:.2f}\n{HEADER}", flush=True)
        results = {} if args.only_mixed else asyncio.run(
            _bench((engine.url, node_key), (web_url, api_key), assets.served_name, args, [web_proc.pid],
                   (web_url, tpm_key)))
        names = _adapters(web_url, api_key, assets, env)
        for name in names:  # each adapter served once through the gateway (loaded on the node) before timing
            deadline = time.monotonic() + 120
            while httpx.post(web_url + "/v1/completions", json={**probe, "model": name}, timeout=120,
                             headers={"Authorization": f"Bearer {api_key}"}).status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the gateway never served adapter {name}")
                time.sleep(0.5)
        floor_port = free_port()
        procs.start("passthrough", [PY, "-m", "uvicorn", "devtools.passthrough:app", "--host", "127.0.0.1", "--port",
                                    str(floor_port), "--log-level", "warning", "--no-access-log"],
                    {**env, "PASSTHROUGH_ENGINE_URL": engine.url, "PASSTHROUGH_NODE_KEY": node_key,
                     "PASSTHROUGH_MODELS": json.dumps(names)})
        floor_url = f"http://127.0.0.1:{floor_port}"
        procs.wait_http("passthrough", floor_url + "/v1/models", 60)
        mixed = _mixed((engine.url, node_key), (web_url, api_key), floor_url, assets.served_name, assets.base_dir,
                       names, args, env, f"http://127.0.0.1:{internal_port}/metrics")
        if args.profile:  # py-spy writes its report on SIGINT only (SIGTERM from stop_all loses it)
            web_proc.send_signal(signal.SIGINT)
            try:
                web_proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                print("py-spy did not finish writing its report within 60 s", file=sys.stderr)
            print(f"profile: {args.profile}", flush=True)
        if args.json:
            print(json.dumps({k: {p: {"p50": _pct(v["lat"], .5), "p99": _pct(v["lat"], .99),
                                      "rps": statistics.mean(v["rps"])} for p, v in r.items()}
                              for k, r in results.items()} | {k: r for k, r in mixed.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
