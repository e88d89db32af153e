"""Benchmark the web process's CPU per GB uploaded: ``curl`` multipart, browser-direct and ``quiver push``.

One web process (uvicorn serving ``config.asgi``) on PostgreSQL, Redis and SeaweedFS (started by
``devtools.services`` when absent). Each round uploads the same size of weights once per path, alternating:

- **curl multipart**: ``curl -F files=@… -F base_model=…`` to ``POST /api/v1/adapters/{name}/versions`` (the
  README's example; httpx when curl is missing); the web process parses the body, spools it, hashes it and streams
  it to S3;
- **browser-direct**: what the console's Uppy client does, done here by httpx: ``POST .../uploads`` with the sizes
  and sha256s (its response carries the first 100 part URLs of each file), ``sign`` any further parts, ``PUT`` each
  part straight to S3 (4 at a time), ``complete`` each file;
- **quiver push**: the ``quiver`` command (``clients/python``) as a subprocess, ``--no-wait``: it validates a real
  adapter locally (a bf16 LoRA of the requested size for a Llama-3-8B-shaped base, ``bench-8b``: random bytes would
  fail its local check), then speaks the same direct-upload protocol with 4 parts in flight.

The figure is the web process's own CPU time (user + system, from ``/proc``) over the upload, per GiB: unlike
wall-clock it does not grow when other work competes for the cores. What the idle process burns in the same time
(the gateway's periodic refreshes) is measured first and subtracted. The sha256 check of the browser path runs in
a Celery worker afterwards, outside the web process (no worker runs here; the figure is the web tier's cost).

Targets: browser-direct (issue 8) and ``quiver push`` (issue 33) < 0.5 CPU s/GiB.

Usage:
    ./scripts/bench_upload [--mib 256] [--rounds 2] [--direct-only]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapters_app.validation import BaseModelFacts  # noqa: E402
from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import Processes  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from devtools.synthetic_adapters import RawTensor, peft_config, write_adapter  # noqa: E402

PY = sys.executable
QUIVER = Path(PY).parent / "quiver"  # the client's console script (scripts/setup-venv installs clients/python)
GIB = 1024**3
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` and their children so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    family = set(pids)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) in family:
            family.add(int(stat.parent.name))
    total = 0.0
    for pid in family:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def _fresh_weights(path: Path, mib: int, seed: int) -> None:
    """``mib`` MiB of random bytes, different per ``seed`` (identical bytes would be deduplicated)."""
    with path.open("wb") as out:
        out.write(seed.to_bytes(8, "little"))
        for _ in range(mib):
            out.write(os.urandom(1024 * 1024))


def _bench_adapter(root: Path, mib: int, seed: int) -> tuple[Path, int]:
    """A valid bf16 LoRA of about ``mib`` MiB for ``bench-8b`` (what ``quiver push`` checks locally); its rank.

    The weights are one fill byte (0x3C3C, a small normal bf16: never NaN, Inf or zero); ``seed`` changes the config
    so each round is a new version."""
    base = BaseModelFacts.from_hf_config("bench-8b", LLAMA3_8B)
    per_rank = sum(2 * (base.modules[m].in_features + base.modules[m].out_features) for m in MODULES)
    r = max(1, round(mib * 2**20 / (per_rank * base.num_hidden_layers)))
    tensors = {}
    for i in range(base.num_hidden_layers):
        for m in MODULES:
            shape, path = base.modules[m], f"base_model.model.model.layers.{i}.{base.blocks[m]}.{m}"
            tensors[f"{path}.lora_A.weight"] = RawTensor("BF16", (r, shape.in_features), fill=0x3C)
            tensors[f"{path}.lora_B.weight"] = RawTensor("BF16", (shape.out_features, r), fill=0x3C)
    config = peft_config("bench-8b", r=r, lora_alpha=2 * r, target_modules=list(MODULES), lora_dropout=seed / 1000)
    return write_adapter(root, config, tensors), r


def _quiver_push(adapter: str, folder: Path, env: dict[str, str]) -> None:
    argv = [str(QUIVER), "push", str(folder), "--name", adapter, "--base-model", "bench-8b", "--no-wait", "--json"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"quiver push: exit {out.returncode}: {out.stderr.strip()[-300:]}")
    result = json.loads(out.stdout)
    if result["parts_sent"] != result["parts_total"]:
        raise RuntimeError(f"quiver push sent {result['parts_sent']} of {result['parts_total']} parts")


def _curl(url: str, key: str, adapter: str, config: Path, weights: Path) -> None:
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {key}",
            "-F", f"files=@{config};filename=adapter_config.json",
            "-F", f"files=@{weights};filename=adapter_model.safetensors", "-F", "base_model=bench-base",
            f"{url}/api/v1/adapters/{adapter}/versions"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.stdout.strip() != "201":
        raise RuntimeError(f"curl multipart upload: HTTP {out.stdout.strip()} {out.stderr.strip()[:300]}")


def _through_django(http: httpx.Client, adapter: str, config: Path, weights: Path) -> None:
    with config.open("rb") as c, weights.open("rb") as w:
        resp = http.post(f"/api/v1/adapters/{adapter}/versions", data={"base_model": "bench-base"},
                         files=[("files", ("adapter_config.json", c)), ("files", ("adapter_model.safetensors", w))],
                         timeout=600)
    if resp.status_code != 201:
        raise RuntimeError(f"through-Django upload: {resp.status_code} {resp.text[:300]}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _direct(http: httpx.Client, adapter: str, config: Path, weights: Path, digests: dict[Path, str],
            cpu: Callable[[], float], steps: dict[str, float]) -> None:
    """One browser-direct upload; adds the web process's CPU seconds of each step to ``steps``."""
    mark = [cpu()]

    def step(name: str) -> None:
        now = cpu()
        steps[name] = steps.get(name, 0.0) + now - mark[0]
        mark[0] = now

    files = [("adapter_config.json", config), ("adapter_model.safetensors", weights)]
    declared = [{"name": n, "size": p.stat().st_size, "sha256": digests[p]} for n, p in files]
    resp = http.post(f"/api/v1/adapters/{adapter}/uploads", json={"files": declared, "base_model": "bench-base"})
    if resp.status_code != 201:
        raise RuntimeError(f"create upload: {resp.status_code} {resp.text[:300]}")
    step("create")
    upload = resp.json()
    base = f"/api/v1/adapters/{adapter}/uploads/{upload['id']}"
    part_size = upload["part_size"]
    for (name, path), meta in zip(files, upload["files"], strict=True):
        numbers = list(range(1, meta["parts"] + 1))
        urls: dict[str, str] = dict(upload["part_urls"][name])  # the first 100 come with the create response
        unsigned = [n for n in numbers if str(n) not in urls]
        for start in range(0, len(unsigned), 100):
            signed = http.post(f"{base}/sign", json={"name": name, "part_numbers": unsigned[start:start + 100]})
            urls.update(signed.json()["urls"])
        step("sign")

        def put(n: int, path: Path = path, urls: dict[str, str] = urls) -> dict[str, object]:
            with path.open("rb") as f:
                f.seek((n - 1) * part_size)
                body = f.read(part_size)
            r = httpx.put(urls[str(n)], content=body, timeout=120)
            r.raise_for_status()
            return {"PartNumber": n, "ETag": r.headers["etag"]}

        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(put, numbers))
        step("part PUTs to S3 (idle web)")
        done = http.post(f"{base}/complete", json={"name": name, "parts": parts})
        if done.status_code != 200:
            raise RuntimeError(f"complete {name}: {done.status_code} {done.text[:300]}")
        step("complete")


def main(argv: list[str] | None = None) -> int:
    """Start the web process, upload by each path in alternating rounds, print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="weights size per upload, MiB")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (one upload per path each)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds to measure the idle process's CPU")
    parser.add_argument("--direct-only", action="store_true", help="only the direct paths (for profiling)")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL") or not os.environ.get("AWS_S3_ENDPOINT_URL"):
        raise SystemExit("run through ./scripts/bench_upload (it starts PostgreSQL, Redis and SeaweedFS)")
    if not QUIVER.exists():
        raise SystemExit(f"{QUIVER} is missing: run ./scripts/setup-venv (it installs clients/python)")
    assets = ensure_demo_assets(REPO / ".cache" / "demo-assets")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-upload-"))
    (workdir / "logs").mkdir()
    procs = Processes(workdir / "logs")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false",
           "DJANGO_LOG_LEVEL": "WARNING", "QUIVER_NODE_SECRET": os.urandom(32).hex(),
           "DJANGO_SECRET_KEY": os.urandom(32).hex(), "QUIVER_API_KEY_HMAC_KEY": os.urandom(32).hex(),
           "QUIVER_MAX_UPLOAD_BYTES": str((args.mib + 16) * 1024 * 1024)}
    config = next(iter(assets.adapters.values())) / "adapter_config.json"
    weights = workdir / "adapter_model.safetensors"
    curl = "curl multipart" if shutil.which("curl") else "httpx multipart"
    paths = ("browser-direct", "quiver push") if args.direct_only else (curl, "browser-direct", "quiver push")
    figures: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
    steps: dict[str, float] = {}
    (workdir / "bench-8b").mkdir()
    (workdir / "bench-8b" / "config.json").write_text(json.dumps(LLAMA3_8B))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        stack.callback(procs.stop_all)
        _manage(env, "migrate", "--noinput")
        _manage(env, "quiver_base_model_register", "bench-base", str(assets.base_dir), "--max-lora-rank", "16")
        _, rank = _bench_adapter(workdir / "quiver-adapter", args.mib, seed=0)
        _manage(env, "quiver_base_model_register", "bench-8b", str(workdir / "bench-8b"), "--max-lora-rank",
                str(max(rank, 16)))
        api_key = _manage(env, "quiver_tenant_create", f"bench{os.getpid()}", "--name", "Bench").splitlines()[-1]
        client_env = {**os.environ, "QUIVER_URL": url, "QUIVER_API_KEY": api_key,
                      "QUIVER_STATE_DIR": str(workdir / "quiver-state")}
        web = procs.start("web", [PY, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                                  str(port), "--log-level", "warning", "--no-access-log"], env)
        procs.wait_http("web", f"{url}/healthz", 60)
        http = stack.enter_context(httpx.Client(base_url=url, timeout=120,
                                                headers={"Authorization": f"Bearer {api_key}"}))
        http.get("/api/v1/adapters").raise_for_status()  # warm imports before measuring
        # What the idle process burns anyway (the gateway's background refreshes): subtracted from every figure.
        cpu0, t0 = _cpu_s([web.pid]), time.perf_counter()
        time.sleep(args.idle_s)
        idle_rate = (_cpu_s([web.pid]) - cpu0) / (time.perf_counter() - t0)
        print(f"idle web process: {idle_rate * 1000:.1f} ms CPU per s (subtracted below)", flush=True)
        for rnd in range(args.rounds):
            for path in paths:
                if path == "quiver push":
                    folder, _ = _bench_adapter(workdir / "quiver-adapter", args.mib, seed=rnd + 1)
                    size = sum(f.stat().st_size for f in folder.iterdir())
                else:
                    _fresh_weights(weights, args.mib, seed=paths.index(path) + rnd * 4)
                    digests = {config: _sha256(config), weights: _sha256(weights)}  # the browser's cost, not the web's
                    size = config.stat().st_size + weights.stat().st_size
                cpu0, t0 = _cpu_s([web.pid]), time.perf_counter()
                if path == "quiver push":
                    _quiver_push(f"quiver-{rnd}", folder, client_env)
                elif path == "curl multipart":
                    _curl(url, api_key, f"curl-{rnd}", config, weights)
                elif path == "httpx multipart":
                    _through_django(http, f"django-{rnd}", config, weights)
                else:
                    _direct(http, f"direct-{rnd}", config, weights, digests, lambda: _cpu_s([web.pid]), steps)
                wall = time.perf_counter() - t0
                cpu = max(_cpu_s([web.pid]) - cpu0 - idle_rate * wall, 0.0)
                figures[path].append((cpu / (size / GIB), size / GIB / wall))
                print(f"round {rnd + 1} {path:>15}: {size / 2**20:7.1f} MiB in {wall:6.2f} s, web CPU {cpu:6.3f} s",
                      flush=True)
    print(f"\nweb process CPU per GiB uploaded ({args.mib} MiB weights, {args.rounds} rounds, mean; cores: "
          f"{os.cpu_count()}; load avg: {os.getloadavg()[0]:.2f})")
    print(f"{'path':>15} | {'CPU s/GiB':>9} | {'GiB/s (wall)':>12}")
    mean = {p: statistics.mean(r[0] for r in rows) for p, rows in figures.items()}
    for path, rows in figures.items():
        print(f"{path:>15} | {mean[path]:9.3f} | {statistics.mean(r[1] for r in rows):12.3f}")
    print("browser-direct web CPU by step, ms per upload (not idle-corrected): "
          + ", ".join(f"{k} {v * 1000 / args.rounds:.0f}" for k, v in steps.items()))
    print("quiver push's wall time includes its local validation and sha256 of the adapter (client CPU, not web)")
    met = all(mean[p] < 0.5 for p in ("browser-direct", "quiver push"))
    if curl in mean:
        print(f"quiver push uses {mean[curl] / max(mean['quiver push'], 1e-9):.0f}x less web CPU than {curl}")
    print(f"target < 0.5 s/GiB for browser-direct ({mean['browser-direct']:.3f}) and quiver push "
          f"({mean['quiver push']:.3f}): {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
