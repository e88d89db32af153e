"""vLLM's two LoRA caches as a state machine, to predict and to simulate what the engine does on its own.

Rules, from ``vllm/lora/worker_manager.py`` (``LRUCacheWorkerLoRAManager``), ``vllm/lora/model_manager.py`` and
``vllm/utils/cache.py`` (``vllm/lora/model_manager.py``):

1. ``add_lora`` of an id not in the CPU cache: if the cache is full, the least recently used *unpinned* entry is
   removed first, and removing it from the CPU cache also empties its GPU slot; all pinned → ``AllPinnedError``.
2. Serving a request activates the adapter: if it is not in a GPU slot and all ``max_loras`` slots are taken, the
   least recently used unpinned active adapter gives up its slot but keeps its CPU copy.
3. Activating an adapter already active only refreshes its recency.
4. Pins hold the CPU copy only: Quiver's worker extension makes ``pin_adapter`` skip vLLM's GPU pin
   (``inference.node.worker_ext._pin_in_cpu_cache_only``: a pinned GPU slot plus a full batch of unpinned adapters
   kills the engine), so GPU slots stay a plain LRU.
"""

from __future__ import annotations

from collections import OrderedDict

from inference.policy.eviction import AllPinnedError
from inference.policy.tiers import Tier


class LoRAEngineModel:
    """One engine's GPU slots and CPU cache.

    Args:
        max_loras: GPU slots (``--max-loras``).
        max_cpu_loras: CPU cache entries (``--max-cpu-loras``, ≥ ``max_loras`` as vLLM requires).

    Raises:
        ValueError: ``max_cpu_loras < max_loras`` or ``max_loras < 1``.
    """

    def __init__(self, max_loras: int, max_cpu_loras: int) -> None:
        if max_loras < 1 or max_cpu_loras < max_loras:
            raise ValueError("need 1 ≤ max_loras ≤ max_cpu_loras (vLLM's LoRAConfig rule)")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.cpu: OrderedDict[int, None] = OrderedDict()  # registered, LRU first
        self.gpu: OrderedDict[int, None] = OrderedDict()  # active, LRU first
        self.pinned: set[int] = set()

    def tier(self, lora_int_id: int) -> Tier:
        """``GPU``, ``CPU`` or ``COLD`` (not in the engine)."""
        if lora_int_id in self.gpu:
            return Tier.GPU
        return Tier.CPU if lora_int_id in self.cpu else Tier.COLD

    def _lru_unpinned(self, cache: OrderedDict[int, None]) -> int:
        for key in cache:
            if key not in self.pinned or cache is self.gpu:  # rule 4: GPU slots ignore pins
                return key
        raise AllPinnedError("All items are pinned, cannot remove oldest from the cache.")

    def add_lora(self, lora_int_id: int) -> list[int]:
        """Register ``lora_int_id`` in the CPU cache (rule 1).

        Returns:
            Ids evicted from the engine (CPU and GPU together) to make room.

        Raises:
            AllPinnedError: the cache is full of pins.
        """
        if lora_int_id in self.cpu:
            self.cpu.move_to_end(lora_int_id)
            return []
        evicted: list[int] = []
        if len(self.cpu) >= self.max_cpu_loras:
            victim = self._lru_unpinned(self.cpu)
            self.remove_lora(victim)
            evicted.append(victim)
        self.cpu[lora_int_id] = None
        return evicted

    def activate(self, lora_int_id: int) -> tuple[list[int], int | None]:
        """Serve a request with ``lora_int_id``: register if needed, then take a GPU slot (rules 1–3).

        Returns:
            (ids evicted from the engine, id that lost its GPU slot or None).

        Raises:
            AllPinnedError: the CPU cache is full of pins.
        """
        evicted = self.add_lora(lora_int_id)
        if lora_int_id in self.gpu:
            self.gpu.move_to_end(lora_int_id)
            return evicted, None
        demoted = None
        if len(self.gpu) >= self.max_loras:
            demoted = self._lru_unpinned(self.gpu)
            del self.gpu[demoted]
        self.gpu[lora_int_id] = None
        return evicted, demoted

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop ``lora_int_id`` from both tiers and its pin; True if it was in the engine."""
        self.gpu.pop(lora_int_id, None)
        self.pinned.discard(lora_int_id)
        return self.cpu.pop(lora_int_id, 0) is None

    def pin_lora(self, lora_int_id: int) -> None:
        """Pin an adapter's CPU copy (registering it; rule 4: no GPU slot is taken or held).

        Raises:
            AllPinnedError: no unpinned entry can make room.
        """
        self.add_lora(lora_int_id)
        self.pinned.add(lora_int_id)
