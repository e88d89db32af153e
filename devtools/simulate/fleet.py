"""Simulated nodes: vLLM's two LoRA caches (``inference.policy.engine_model``), a byte-budgeted disk cache, a
request queue and one loader that performs swaps and loads one at a time."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from inference.policy.engine_model import LoRAEngineModel
from inference.policy.tiers import Tier


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Fleet shape.

    Attributes:
        nodes: node count.
        gpu_slots: ``--max-loras`` per node.
        cpu_slots: ``--max-cpu-loras`` per node.
        disk_bytes: node disk cache budget, bytes.
        concurrency: requests a node runs at once (``--max-num-seqs``); more wait.
        service_s: mean time a request occupies a node once its adapter is ready, seconds (exponential).
    """

    nodes: int = 4
    gpu_slots: int = 8
    cpu_slots: int = 64
    disk_bytes: int = 20 << 30
    concurrency: int = 32
    service_s: float = 2.0


class SimNode:
    """One node's state during a run."""

    __slots__ = ("name", "engine", "disk", "disk_used", "disk_bytes", "inflight", "served",
                 "pending", "stats", "concurrency", "busy_until", "flights")

    def __init__(self, name: str, fleet: FleetSpec) -> None:
        self.name = name
        self.engine = LoRAEngineModel(fleet.gpu_slots, fleet.cpu_slots)
        self.disk: OrderedDict[int, int] = OrderedDict()  # id -> bytes, LRU first
        self.disk_used = 0
        self.disk_bytes = fleet.disk_bytes
        self.inflight: list[tuple[float, int]] = []  # (completion time, adapter) per request in flight (heap)
        self.flights: dict[int, int] = {}  # adapter -> its requests in flight here (the batch's adapters)
        self.served = 0
        self.pending: dict[int, tuple[float, Tier]] = {}  # id -> (ready at, tier it was loaded from)
        self.stats: dict[int, list[float]] = {}  # id -> [last used, hits, hits at]
        self.concurrency = fleet.concurrency
        self.busy_until: dict[int, float] = {}  # id -> when its last request in flight here finishes

    def start(self, adapter: int, done: float) -> None:
        """A request for ``adapter`` runs here until ``done`` (seconds)."""
        heapq.heappush(self.inflight, (done, adapter))
        self.flights[adapter] = self.flights.get(adapter, 0) + 1
        if self.busy_until.get(adapter, 0.0) < done:
            self.busy_until[adapter] = done

    def advance(self, t: float) -> None:
        """Finish every request done by ``t``."""
        h, flights = self.inflight, self.flights
        while h and h[0][0] <= t:
            _, adapter = heapq.heappop(h)
            left = flights[adapter] - 1
            if left:
                flights[adapter] = left
            else:
                del flights[adapter]

    def batch_room(self, adapter: int) -> tuple[bool, bool]:
        """``(in_batch, batch_full)`` for a request for ``adapter``, as the gateway sees the node's running batch
        (``inference.gateway.snapshot``): a request of it is in flight here; or, not, ``max_loras`` other adapters
        are (vLLM would defer it)."""
        flights = self.flights
        if adapter in flights:
            return True, False
        return False, len(flights) >= self.engine.max_loras

    @property
    def running(self) -> int:
        """Requests in the running batch."""
        return min(len(self.inflight), self.concurrency)

    @property
    def waiting(self) -> int:
        """Requests queued behind the batch."""
        return max(0, len(self.inflight) - self.concurrency)

    @property
    def kv(self) -> float:
        """KV-cache use, 0..1: the batch fills it at 80 % of ``concurrency`` requests (GIE's 0.8 mark)."""
        return min(1.0, 0.8 * len(self.inflight) / self.concurrency)

    def load_figures(self) -> tuple[int, int, float]:
        """``(running, waiting, kv)`` at once: one pass per routing decision instead of three properties."""
        n = len(self.inflight)
        c = self.concurrency
        return (n if n < c else c), (n - c if n > c else 0), min(1.0, 0.8 * n / c)

    def tier(self, adapter: int) -> Tier:
        """Where ``adapter`` is on this node now."""
        tier = self.engine.tier(adapter)
        if tier is Tier.COLD and adapter in self.disk:
            return Tier.DISK
        return tier
