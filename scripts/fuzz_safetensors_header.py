"""Long fuzz run over the safetensors header parser (issue 3 acceptance: >= 10,000 mutated files).

Each iteration builds a small valid file, mutates it (devtools/safetensors_fuzz.py), parses it with
``parse_header`` and checks: no exception, no slow parse (hang), bounded RSS, and that anything accepted is also
accepted identically by the reference parser (safetensors' Rust ``deserialize``). Failing inputs are saved.

Usage:
    .venv/bin/python scripts/fuzz_safetensors_header.py [--iterations 20000] [--seed 0] [--out /tmp/fuzz-findings]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safetensors._safetensors_rust import SafetensorError, deserialize  # noqa: E402

from adapters_app.validation.safetensors_header import parse_header  # noqa: E402
from devtools.safetensors_fuzz import mutate, seed_file  # noqa: E402

SLOW_SECONDS = 0.5
MAX_RSS_GROWTH_MB = 64


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _check(data: bytes) -> str | None:
    """Return a finding's description, or None if the parser behaved."""
    started = time.perf_counter()
    try:
        header, problems = parse_header(io.BytesIO(data), len(data))
    except Exception:  # noqa: BLE001 - any exception is a finding
        return "crash:\n" + traceback.format_exc()
    took = time.perf_counter() - started
    if took > SLOW_SECONDS:
        return f"slow: {took:.2f} s"
    if (header is None) != bool(problems):
        return "inconsistent result"
    if header is None:
        return None
    try:
        ref = deserialize(data)
    except SafetensorError as exc:
        return f"differential: accepted here, rejected by the reference ({exc})"
    mine = {t.name: (t.dtype, list(t.shape)) for t in header.tensors}
    theirs = {n: (d["dtype"], list(d["shape"])) for n, d in ref}
    return None if mine == theirs else "differential: different tensors"


def main() -> int:
    """Run the fuzzer; exit status 1 if anything was found."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/fuzz-findings"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rss0 = _rss_mb()
    findings = accepted = 0
    started = time.perf_counter()
    for i in range(args.iterations):
        data = mutate(seed_file(rng), rng)
        finding = _check(data)
        if finding is None and _rss_mb() - rss0 > MAX_RSS_GROWTH_MB:
            finding = f"memory: RSS grew by {_rss_mb() - rss0:.0f} MB"
        if finding:
            findings += 1
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"finding-{i}.safetensors").write_bytes(data)
            print(f"[{i}] {finding.splitlines()[0]} -> {args.out}/finding-{i}.safetensors")
        elif parse_header(io.BytesIO(data), len(data))[0] is not None:
            accepted += 1
    elapsed = time.perf_counter() - started
    print(
        f"{args.iterations} mutated files in {elapsed:.1f} s ({args.iterations / elapsed:.0f}/s); "
        f"{accepted} accepted (all matched the reference parser), {findings} findings, "
        f"RSS growth {_rss_mb() - rss0:.1f} MB"
    )
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
