"""Measure, on this CPU node, what an adapter load and a CPU->GPU swap cost inside the real vLLM engine.

Starts one engine (inference.node.launch, max_loras 2, max_cpu_loras 4), loads tiny PEFT adapters through
/quiver/v1/add_lora (disk -> CPU cache, then a GPU slot) and times, per adapter, the call itself and a 1-token
completion when the adapter is (a) in a GPU slot, (b) only in the CPU cache. Prints medians in ms; the simulator's
`engine_add_lora_ms` (devtools/simulate/costs.py) quotes this run. Run: .venv/bin/python scripts/measure_engine_load.py
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demo.assets import ensure_demo_assets  # noqa: E402
from demo.tiny_model import make_random_adapter  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from inference.node.launch import EngineConfig, engine_argv, engine_env  # noqa: E402

ROUNDS = 6


def main() -> int:
    assets = ensure_demo_assets(served_name="tiny-llama")
    work = Path(tempfile.mkdtemp(prefix="quiver-measure-"))
    config = EngineConfig.cpu_dev(assets.base_dir, "tiny-llama", port=free_port(), api_key="measure-key-" + "x" * 24)
    env = engine_env(config, {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"})
    log = (work / "engine.log").open("wb")
    proc = subprocess.Popen(engine_argv(config), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    headers = {"Authorization": f"Bearer {config.api_key}"}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(config.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        client = httpx.Client(base_url=config.url, headers=headers, timeout=120)
        folders = [make_random_adapter(assets.base_dir, work / f"a{i}", r=16, lora_alpha=16,
                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"], seed=10 + i)
                   for i in range(ROUNDS + 4)]

        def complete(name: str) -> float:
            t = time.perf_counter()
            r = client.post("/v1/completions", json={"model": name, "prompt": "the", "max_tokens": 1})
            r.raise_for_status()
            return (time.perf_counter() - t) * 1000

        add_ms, gpu_ms, cpu_ms = [], [], []
        for i, folder in enumerate(folders):
            t = time.perf_counter()
            client.post("/quiver/v1/add_lora", json={"lora_name": f"m{i}", "lora_int_id": 5000 + i,
                                                     "lora_path": str(folder)}).raise_for_status()
            add_ms.append((time.perf_counter() - t) * 1000)
            gpu_ms.append(complete(f"m{i}"))  # just added: in a GPU slot
            if i >= 2:
                cpu_ms.append(complete(f"m{i - 2}"))  # pushed out of the 2 slots, still in the CPU cache
        size = sum(f.stat().st_size for f in folders[0].iterdir())
        print(f"adapter: all-linear r16 on the tiny Llama, {size / 1e6:.2f} MB on disk")
        print(f"add_lora (disk -> CPU cache -> GPU slot), median of {len(add_ms)}: {statistics.median(add_ms):.1f} ms")
        print(f"1-token completion, adapter in a GPU slot: {statistics.median(gpu_ms):.1f} ms")
        print(f"1-token completion, adapter in the CPU cache only (swap in): {statistics.median(cpu_ms):.1f} ms")
        print(f"swap cost (difference of medians): {statistics.median(cpu_ms) - statistics.median(gpu_ms):.1f} ms")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
