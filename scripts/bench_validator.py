"""Benchmark the adapter validator on a generated ~1 GB adapter (issue 3, "Cost").

Generates a bf16 LoRA adapter shaped for a Llama-3-8B-sized base (r=64 on all seven projections of 32 layers is
~335 MB, so the rank is chosen to reach the target size), validates it, and prints throughput and RSS growth.
Goal: >= 500 MB/s on one core and <= 64 MB RSS growth. Data is random bytes that never form NaN/Inf.

Usage:
    .venv/bin/python scripts/bench_validator.py [--size-mb 1024] [--dir /tmp] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters_app.validation import BaseModelFacts, PoolLimits, validate_adapter_dir  # noqa: E402
from devtools.synthetic_adapters import RawTensor, peft_config, write_adapter  # noqa: E402

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _rss_mb() -> float:
    """Current resident set size in MB (Linux /proc), falling back to the peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _PeakRss:
    """Samples RSS every few milliseconds in a thread, to catch the peak during a call."""

    def __init__(self) -> None:
        self.peak = _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mb())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _tensors(base: BaseModelFacts, size_mb: int) -> tuple[dict[str, RawTensor], int]:
    per_rank = (
        sum(2 * (base.modules[m].in_features + base.modules[m].out_features) for m in MODULES)
        * base.num_hidden_layers
    )
    r = max(1, round(size_mb * 2**20 / per_rank))
    out: dict[str, RawTensor] = {}
    for i in range(base.num_hidden_layers):
        for m in MODULES:
            s = base.modules[m]
            path = f"base_model.model.model.layers.{i}.{base.blocks[m]}.{m}"
            # 0x3C in every byte: bf16 words 0x3C3C (a small positive normal), never NaN/Inf or zero.
            out[f"{path}.lora_A.weight"] = RawTensor("BF16", (r, s.in_features), fill=0x3C)
            out[f"{path}.lora_B.weight"] = RawTensor("BF16", (s.out_features, r), fill=0x3C)
    return out, r


def main() -> int:
    """Run the benchmark; exit status 1 if a goal is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the adapter (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated adapter")
    args = ap.parse_args()
    base = BaseModelFacts.from_hf_config("bench/llama-3-8b", LLAMA3_8B)
    workdir = Path(tempfile.mkdtemp(prefix="quiver-bench-", dir=args.dir))
    try:
        tensors, r = _tensors(base, args.size_mb)
        t0 = time.perf_counter()
        root = write_adapter(
            workdir / "adapter",
            peft_config(base.base_model_name, r=r, lora_alpha=2 * r, target_modules=list(MODULES)),
            tensors,
        )
        size = (root / "adapter_model.safetensors").stat().st_size
        print(f"generated r={r} adapter: {size / 2**20:.0f} MB in {time.perf_counter() - t0:.1f} s")
        limits = PoolLimits(max_lora_rank=max(r, 16), max_adapter_bytes=2 * size)
        rss0 = _rss_mb()
        with _PeakRss() as peak:
            t0 = time.perf_counter()
            report = validate_adapter_dir(root, base=base, limits=limits)
            elapsed = time.perf_counter() - t0
        mbps = size / 2**20 / elapsed
        growth = peak.peak - rss0
        print(
            f"validated in {elapsed:.2f} s: {mbps:.0f} MB/s, RSS {rss0:.0f} MB, peak {peak.peak:.0f} MB "
            f"(growth {growth:.1f} MB), "
            f"ok={report.ok} codes={sorted(set(report.codes))}"
        )
        # Side by side in the same run: plain sha256 over the same file in the same 4 MB chunks, the floor
        # every upload already pays; the ratio shows what validation adds on this machine and page cache.
        t0 = time.perf_counter()
        digest = hashlib.sha256()
        with (root / "adapter_model.safetensors").open("rb") as f:
            while chunk := f.read(4 << 20):
                digest.update(chunk)
        sha_mbps = size / 2**20 / (time.perf_counter() - t0)
        print(f"baseline sha256 over the same file: {sha_mbps:.0f} MB/s; validator / sha256 = {mbps / sha_mbps:.2f}")
        goals = mbps >= 500 and growth <= 64 and report.ok
        print("goals (>= 500 MB/s, <= 64 MB RSS growth, accepted):", "met" if goals else "MISSED")
        return 0 if goals else 1
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
