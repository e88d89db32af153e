"""Simulated nodes: vLLM's two LoRA caches (``inference.policy.engine_model``), a byte-budgeted disk cache, a
request queue and one loader that performs swaps and loads one at a time."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

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
        defer: model vLLM's LoRA batch limit: a node runs the requests of at most ``gpu_slots`` adapters (the first
            to arrive among those in flight); the others wait (``waiting``), are scheduled when one of those drains,
            and only then need their adapter in the CPU cache (a load then if it left). The node's busy set and the
            gateway's batch flags are that running batch. Off: every request runs on arrival (the main tables).
    """

    nodes: int = 4
    gpu_slots: int = 8
    cpu_slots: int = 64
    disk_bytes: int = 20 << 30
    concurrency: int = 32
    service_s: float = 2.0
    defer: bool = False


class SimNode:
    """One node's state during a run."""

    __slots__ = ("name", "engine", "disk", "disk_used", "disk_bytes", "inflight", "served",
                 "pending", "stats", "concurrency", "busy_until", "flights", "defer", "deferred")

    def __init__(self, name: str, fleet: FleetSpec) -> None:
        self.name = name
        self.engine = LoRAEngineModel(fleet.gpu_slots, fleet.cpu_slots)
        self.disk: OrderedDict[int, int] = OrderedDict()  # id -> bytes, LRU first
        self.disk_used = 0
        self.disk_bytes = fleet.disk_bytes
        self.inflight: list[tuple[float, int]] = []  # (completion time, adapter) per request in flight (heap)
        self.flights: dict[int, int] = {}  # adapter -> its requests in flight here, in order of arrival
        self.defer = fleet.defer
        self.deferred: dict[int, list[int]] = {}  # adapter -> requests (trace indexes) waiting for the batch
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

    def advance(self, t: float, admit: Callable[[int, list[int], float], None] | None = None) -> None:
        """Finish every request done by ``t``, in order; with ``defer``, ``admit(adapter, requests, at)`` is called
        for each deferred adapter as the running batch takes it (a drained adapter leaves room; a deferred request
        that is done was scheduled by then)."""
        h, flights = self.inflight, self.flights
        while h and h[0][0] <= t:
            done, adapter = heapq.heappop(h)
            if self.deferred and admit is not None:
                waiting = self.deferred.pop(adapter, None)
                if waiting:
                    admit(adapter, waiting, done)
            left = flights[adapter] - 1
            if left:
                flights[adapter] = left
            else:
                del flights[adapter]
                if self.deferred and admit is not None:
                    for other, waiting in self.admitted():
                        admit(other, waiting, done)

    def batch(self) -> list[int]:
        """The adapters of the running batch: with ``defer``, the first ``max_loras`` in flight; else every one."""
        if not self.defer:
            return list(self.flights)
        return list(islice(self.flights, self.engine.max_loras))

    def batch_room(self, adapter: int) -> tuple[bool, bool]:
        """``(in_batch, batch_full)`` for a request for ``adapter``, as the gateway sees the node's running batch
        (``inference.gateway.snapshot``): a request of it runs here; or, not, ``max_loras`` other adapters do (vLLM
        would defer it)."""
        batch = self.batch() if self.defer else self.flights  # the dict itself: no copy per decision
        if adapter in batch:
            return True, False
        return False, len(batch) >= self.engine.max_loras

    def runs_now(self, adapter: int) -> bool:
        """Whether a request for ``adapter`` arriving now is scheduled at once (always without ``defer``)."""
        if not self.defer:
            return True
        if self.deferred.get(adapter):
            return False
        batch = self.batch()
        return adapter in batch or len(batch) < self.engine.max_loras

    def busy(self, adapter: int, t: float) -> bool:
        """Whether the node's rule must keep ``adapter`` at ``t``: a request of it runs here (the running batch with
        ``defer``, the engine's own busy set; else any request in flight)."""
        if self.defer:
            return adapter in self.batch()
        return self.busy_until.get(adapter, 0.0) > t

    def admitted(self) -> list[tuple[int, list[int]]]:
        """Deferred adapters that the running batch now holds, with their waiting requests (removed here)."""
        if not self.deferred:
            return []
        out = []
        for adapter in self.batch():
            waiting = self.deferred.pop(adapter, None)
            if waiting:
                out.append((adapter, waiting))
        return out

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
        """``(running, waiting, kv)`` at once: one pass per routing decision instead of three properties (with
        ``defer``, requests waiting for the batch count as waiting, as in ``vllm:num_requests_waiting``)."""
        n = len(self.inflight)
        c = self.concurrency
        held = sum(len(w) for w in self.deferred.values()) if self.deferred else 0
        running = min(n - held, c)
        return running, n - running, min(1.0, 0.8 * n / c)

    def tier(self, adapter: int) -> Tier:
        """Where ``adapter`` is on this node now."""
        tier = self.engine.tier(adapter)
        if tier is Tier.COLD and adapter in self.disk:
            return Tier.DISK
        return tier
