"""Each gateway process's view of node load: the figures node agents publish to Redis, re-read in the background.

The request path only reads a dict (``LoadBoard.get``), so admission costs nothing measurable when nodes are not
saturated. The admission tick (every ``QUIVER_ADMISSION_REFRESH_S``, default 50 ms; 200 ms while every node is calm)
MGETs one key per live node (``inference.node.load_publisher``). With the agent scraping every 100 ms, figures are at
most ~160 ms old when the gateway decides, unless calm; older ones count as unknown (``inference.policy.admission``).

The board also counts what this process sent each node since its figures were taken, less what ended there since
(``sent_since``): the in-flight credit that keeps the admission queue from releasing a burst between two scrapes,
and lets a request that ends hand its place to a waiting one before the next scrape shows it (without the credit
for ended requests, a saturated node took at most ``queue_saturated`` requests per scrape: streaming at
concurrency 64 ran at 0.18× the engine's throughput in ``scripts/bench_gateway``).

Routing also sees which adapters each node's running batch holds (``NodeView.running_loras``): the engine's own list
as last published, plus the adapters this process sent the node after those figures were taken, so that requests
decided between two scrapes see the batches they fill (``inference.policy.routing``'s ``batch_full``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from inference.gateway.snapshot import FleetView
from inference.node.load_publisher import load_decode, load_key
from inference.policy.admission import NodeLoad


class LoadBoard:
    """Node name → last published :class:`NodeLoad`, plus this process's sends per node since then."""

    def __init__(self) -> None:
        self.loads: dict[str, NodeLoad] = {}
        self.version = 0
        self._sent: dict[str, deque[float]] = {}
        self._done: dict[str, deque[float]] = {}
        self._sent_loras: dict[str, dict[str, float]] = {}  # node -> lora_name -> Unix time of the last send
        self._sends = 0  # bumped by every adapter send: the overlay cache's key
        self._overlay: tuple[FleetView, int, float, FleetView] | None = None

    async def refresh(self, redis: Any, names: Iterable[str]) -> None:
        """Re-read the figures of ``names`` (one MGET). Raises what the Redis client raises."""
        wanted, keys = self.wanted(names)
        self.apply(wanted, await redis.mget(keys) if keys else [])

    @staticmethod
    def wanted(names: Iterable[str]) -> tuple[list[str], list[str]]:
        """``(node names, their Redis keys)`` to MGET, for a caller batching the read into its own pipeline."""
        wanted = sorted(set(names))
        return wanted, [load_key(n) for n in wanted]

    def apply(self, wanted: list[str], raw: list[Any]) -> None:
        """Take the MGET answer ``raw`` for ``wanted`` (from :meth:`wanted`)."""
        loads = {}
        for name, value in zip(wanted, raw, strict=True):
            load = load_decode(value)
            if load is not None:
                loads[name] = load
        if loads != self.loads:
            self.loads = loads
            self.version += 1

    def get(self, name: str) -> NodeLoad | None:
        """The node's last figures (any age), or None."""
        return self.loads.get(name)

    def note_sent(self, name: str, now_s: float | None = None, *, lora: str | None = None) -> None:
        """Record that this process just sent ``name`` a request (for the adapter ``lora``, a served name, if any)."""
        now = time.time() if now_s is None else now_s
        self._sent.setdefault(name, deque()).append(now)
        if lora is not None:
            sent = self._sent_loras.setdefault(name, {})
            sent[lora] = now
            self._sends += 1
            if len(sent) > 64:  # only sends newer than the node's figures count: drop the old ones
                load = self.loads.get(name)
                horizon = load.at_s if load is not None else now - 1.0
                for old in [n for n, at in sent.items() if at <= horizon]:
                    del sent[old]

    def note_done(self, name: str, now_s: float | None = None) -> None:
        """Record that a request this process sent ``name`` just ended (its engine slot is free again)."""
        self._done.setdefault(name, deque()).append(time.time() if now_s is None else now_s)

    def sent_since(self, name: str) -> int:
        """Requests this process sent ``name`` after its current figures were taken, less those of its requests
        that ended there since (each ended request moves one waiting request into the engine's batch); may be
        negative, which ``node_saturated`` adds to the figures' waiting count as it is."""
        load = self.loads.get(name)
        count = 0
        for events, sign in ((self._sent.get(name), 1), (self._done.get(name), -1)):
            if not events:
                continue
            if load is not None:
                while events and events[0] <= load.at_s:
                    events.popleft()
            elif len(events) > 4096:  # no figures to age them out against: keep the count bounded
                events.popleft()
            count += sign * len(events)
        return count

    def overlay(self, fleet: FleetView, *, now_s: float, max_age_s: float) -> FleetView:
        """``fleet`` with each node's heartbeat gauges replaced by fresh published figures, where there are any.

        Routing then ranks nodes by the same figures the admission gate judges them by. Cached until the fleet or
        the figures change.
        """
        if not self.loads:
            return fleet
        cached = self._overlay
        key = self.version * 1_000_003 + self._sends
        # Reused while the fleet, the figures and the sends are the same and none of the figures used has gone stale.
        if cached is not None and cached[0] is fleet and cached[1] == key and now_s - cached[2] <= max_age_s:
            return cached[3]
        nodes = []
        oldest = now_s
        for node in fleet.nodes:
            load = self.loads.get(node.name)
            if load is not None and now_s - load.at_s <= max_age_s:
                running = None
                if load.running_loras is not None:
                    sent = self._sent_loras.get(node.name) or {}
                    running = frozenset(load.running_loras).union(n for n, at in sent.items() if at > load.at_s)
                node = replace(node, num_requests_running=load.num_requests_running,
                               num_requests_waiting=load.num_requests_waiting,
                               kv_cache_usage_perc=load.kv_cache_usage_perc, running_loras=running)
                oldest = min(oldest, load.at_s)
            nodes.append(node)
        view = replace(fleet, nodes=tuple(nodes))
        self._overlay = (fleet, key, oldest, view)
        return view
