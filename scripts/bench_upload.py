"""Benchmark the web process's CPU per GB uploaded: browser-direct (presigned S3 multipart) beside through-Django.

One web process (uvicorn serving ``config.asgi``) on PostgreSQL, Redis and SeaweedFS (started by
``devtools.services`` when absent). Each round uploads the same size of fresh random weights twice, alternating:

- **through Django**: one multipart ``POST /api/v1/adapters/{name}/versions`` (what API users do); the web process
  parses the body, spools it, hashes it and streams it to S3;
- **browser-direct**: what the console's Uppy client does, done here by httpx: ``POST .../uploads`` with the sizes
  and sha256s (its response carries the first 100 part URLs of each file), ``sign`` any further parts, ``PUT`` each
  part straight to S3 (4 at a time), ``complete`` each file.

The figure is the web process's own CPU time (user + system, from ``/proc``) over the upload, per GiB: unlike
wall-clock it does not grow when other work competes for the cores. What the idle process burns in the same time
(the gateway's periodic refreshes) is measured first and subtracted. The sha256 check of the browser path runs in
a Celery worker afterwards, outside the web process (no worker runs here; the figure is the web tier's cost).

Target (issue 8): browser-direct < 0.5 CPU s/GB.

Usage:
    ./scripts/bench_upload [--mib 256] [--rounds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import os
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

from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import Processes  # noqa: E402
from devtools.proc import free_port  # noqa: E402

PY = sys.executable
GIB = 1024**3


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
    """Start the web process, upload by both paths in alternating rounds, print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="weights size per upload, MiB")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (one upload per path each)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds to measure the idle process's CPU")
    parser.add_argument("--direct-only", action="store_true", help="only the browser-direct path (for profiling)")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL") or not os.environ.get("AWS_S3_ENDPOINT_URL"):
        raise SystemExit("run through ./scripts/bench_upload (it starts PostgreSQL, Redis and SeaweedFS)")
    assets = ensure_demo_assets(REPO / ".cache" / "demo-assets")
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-upload-"))
    (workdir / "logs").mkdir()
    procs = Processes(workdir / "logs")
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "DJANGO_DEBUG": "false",
           "DJANGO_LOG_LEVEL": "WARNING", "QUIVER_NODE_SECRET": os.urandom(32).hex(),
           "DJANGO_SECRET_KEY": os.urandom(32).hex(), "QUIVER_API_KEY_HMAC_KEY": os.urandom(32).hex(),
           "QUIVER_MAX_UPLOAD_BYTES": str((args.mib + 16) * 1024 * 1024)}
    config = next(iter(assets.adapters.values())) / "adapter_config.json"
    weights = workdir / "adapter_model.safetensors"
    figures: dict[str, list[tuple[float, float]]] = {"through Django": [], "browser-direct": []}
    steps: dict[str, float] = {}
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        _manage(env, "migrate", "--noinput")
        _manage(env, "quiver_base_model_register", "bench-base", str(assets.base_dir), "--max-lora-rank", "16")
        api_key = _manage(env, "quiver_tenant_create", f"bench{os.getpid()}", "--name", "Bench").splitlines()[-1]
        web = procs.start("web", [PY, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                                  str(port), "--log-level", "warning", "--no-access-log"], env)
        procs.wait_http("web", f"http://127.0.0.1:{port}/healthz", 60)
        http = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                                                headers={"Authorization": f"Bearer {api_key}"}))
        http.get("/api/v1/adapters").raise_for_status()  # warm imports before measuring
        # What the idle process burns anyway (the gateway's background refreshes): subtracted from every figure.
        cpu0, t0 = _cpu_s([web.pid]), time.perf_counter()
        time.sleep(args.idle_s)
        idle_rate = (_cpu_s([web.pid]) - cpu0) / (time.perf_counter() - t0)
        print(f"idle web process: {idle_rate * 1000:.1f} ms CPU per s (subtracted below)", flush=True)
        for rnd in range(args.rounds):
            for path in ("browser-direct",) if args.direct_only else ("through Django", "browser-direct"):
                _fresh_weights(weights, args.mib, seed=len(figures[path]) * 2 + (path == "browser-direct") + rnd * 4)
                digests = {config: _sha256(config), weights: _sha256(weights)}  # the browser's cost, not the web's
                size = config.stat().st_size + weights.stat().st_size
                cpu0, t0 = _cpu_s([web.pid]), time.perf_counter()
                if path == "through Django":
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
    for path, rows in ((p, r) for p, r in figures.items() if r):
        print(f"{path:>15} | {statistics.mean(r[0] for r in rows):9.3f} | {statistics.mean(r[1] for r in rows):12.3f}")
    print("browser-direct web CPU by step, ms per upload (not idle-corrected): "
          + ", ".join(f"{k} {v * 1000 / args.rounds:.0f}" for k, v in steps.items()))
    ratio = statistics.mean(r[0] for r in figures["through Django"] or [(0.0, 0.0)]) / max(
        statistics.mean(r[0] for r in figures["browser-direct"]), 1e-9)
    direct = statistics.mean(r[0] for r in figures["browser-direct"])
    print(f"browser-direct uses {ratio:.0f}x less web CPU; target < 0.5 s/GB: {'met' if direct < 0.5 else 'MISSED'}")
    return 0 if direct < 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
