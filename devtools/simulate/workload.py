"""Synthetic request traces: which adapter each request wants, and when.

- Popularity: Zipf(s) over popularity ranks (share of rank k ∝ k^−s), or S-LoRA's draw ``int(power(α) · N)``
  (``S-LoRA:benchmarks/trace.py``: the draw's CDF is x^α, so P(index < k) = (k/N)^α; α = 1 is uniform, α < 1
  piles onto low indices).
  Ranks map to adapter ids through a seeded permutation, so ids carry no popularity.
- Arrivals: gaps ~ Gamma(shape 1/cv², scale cv²/rate) (S-LoRA's generator; cv = 1 is Poisson).
- On/off tenants: a share of tenants is silent every other ``on_off_period_s`` window (VTC's ``on_off_overload``).
- Drift: the trace is cut into ``drift_epochs``; at each cut a share ``drift`` of the adapters swap popularity ranks
  at random.
- New versions: ``new_adapters`` ids arrive at evenly spaced times; each takes over the popularity rank of a random
  live adapter, which retires (a new version replacing an old one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadSpec:
    """Trace parameters (see the module docstring)."""

    adapters: int = 500
    requests: int = 200_000
    zipf: float = 1.0
    slora_alpha: float | None = None
    rate: float = 40.0
    cv: float = 1.0
    tenants: int = 50
    on_off: float = 0.0
    on_off_period_s: float = 60.0
    drift: float = 0.0
    drift_epochs: int = 10
    new_adapters: int = 0
    seed: int = 1


@dataclass(frozen=True)
class Trace:
    """A generated trace.

    Attributes:
        times: arrival times, seconds, ascending (float64, length ``requests``).
        adapters: adapter id per request (int64); ids run ``0 .. total_adapters − 1``.
        total_adapters: ids that exist (initial plus new arrivals).
        tenant_of: tenant id per adapter id.
        rank_of: PEFT ``r`` per adapter id.
    """

    times: np.ndarray
    adapters: np.ndarray
    total_adapters: int
    tenant_of: list[int]
    rank_of: list[int]


def _ranks(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.slora_alpha is not None:
        return np.minimum((rng.power(spec.slora_alpha, n) * spec.adapters).astype(np.int64), spec.adapters - 1)
    weights = 1.0 / np.arange(1, spec.adapters + 1, dtype=np.float64) ** spec.zipf
    cdf = np.cumsum(weights / weights.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), spec.adapters - 1)


def popularity_share(spec: WorkloadSpec, top: int) -> float:
    """Share of requests to the ``top`` most popular ranks under the popularity law (no drift, no on/off)."""
    if spec.slora_alpha is not None:
        # P(index < k) = (k/N)^α; the hot end is index 0 for α < 1 and the last index for α > 1.
        k = min(top, spec.adapters) / spec.adapters
        return float(k**spec.slora_alpha if spec.slora_alpha <= 1 else 1 - (1 - k) ** spec.slora_alpha)
    weights = 1.0 / np.arange(1, spec.adapters + 1, dtype=np.float64) ** spec.zipf
    return float(weights[:top].sum() / weights.sum())


def generate(spec: WorkloadSpec) -> Trace:
    """Build the trace (deterministic for a given ``spec``).

    Raises:
        ValueError: a parameter out of range, naming it.
    """
    if spec.adapters < 1 or spec.requests < 1:
        raise ValueError("--adapters and --requests must be ≥ 1")
    if not 0 <= spec.drift <= 1 or not 0 <= spec.on_off <= 1:
        raise ValueError("--drift and --on-off are shares between 0 and 1")
    if spec.rate <= 0 or spec.cv <= 0:
        raise ValueError("--rate and --cv must be > 0")
    rng = np.random.default_rng(spec.seed)
    total = spec.adapters + spec.new_adapters
    tenant_of = [int(x) for x in rng.integers(0, spec.tenants, total)]
    rank_of = [int(x) for x in rng.choice([8, 16, 32], size=total, p=[0.3, 0.5, 0.2])]
    bursty = rng.random(spec.tenants) < spec.on_off
    phase = rng.random(spec.tenants) * 2 * spec.on_off_period_s
    n = int(spec.requests * (1.0 + spec.on_off) * 1.1) + 64
    shape = 1.0 / spec.cv**2
    gaps = rng.gamma(shape, spec.cv**2 / spec.rate / (1.0 + spec.on_off / 2), n)
    times = np.cumsum(gaps)
    ranks = _ranks(spec, rng, n)
    perm = rng.permutation(spec.adapters).astype(np.int64)  # rank -> adapter id
    # Cut points where the rank -> id mapping changes: drift epochs and new arrivals.
    events: list[tuple[int, str]] = []
    if spec.drift > 0:
        events += [(spec.requests * e // spec.drift_epochs, "drift") for e in range(1, spec.drift_epochs)]
    events += [(spec.requests * (j + 1) // (spec.new_adapters + 1), "new") for j in range(spec.new_adapters)]
    events.sort()
    adapters = np.empty(n, dtype=np.int64)
    start, next_new = 0, spec.adapters
    for cut, kind in [*events, (n, "end")]:
        adapters[start:cut] = perm[ranks[start:cut]]
        start = cut
        if kind == "drift":
            moved = rng.choice(spec.adapters, size=int(spec.drift * spec.adapters), replace=False)
            perm[moved] = perm[rng.permutation(moved)]
        elif kind == "new":
            perm[rng.integers(0, spec.adapters)] = next_new
            next_new += 1
    tenants = np.asarray(tenant_of, dtype=np.int64)[adapters]
    off = bursty[tenants] & (((times + phase[tenants]) // spec.on_off_period_s) % 2 == 1)
    keep = np.flatnonzero(~off)[: spec.requests]
    if len(keep) < spec.requests:
        raise ValueError("on/off filtering left too few requests; lower --on-off")
    return Trace(times=times[keep], adapters=adapters[keep], total_adapters=total, tenant_of=tenant_of,
                 rank_of=rank_of)
