"""The admission gate: hold requests in the gateway while every eligible node is saturated, release them fairly.

Decisions are ``inference.policy.admission``'s pure functions; this module keeps the state and does the I/O.

- **Fast path.** The request's node is chosen as always (routing sees the fresh figures, ``LoadBoard.overlay``); if
  that node is not saturated and nobody is queued in this process, the request goes at once. Cost: a dict read
  and two comparisons.
- **Queue.** Otherwise the request waits in this process's queue: strict priority bands (lower first, vLLM's
  ``priority`` convention), then VTC across tenants, FIFO within a tenant. Every refresh tick (50 ms) the
  dispatcher releases head requests whose pool has room, counting what it already released since the node's
  last figures as waiting (so a burst between scrapes cannot overshoot). A request leaves with 429, ``Retry-After``
  and an OpenAI error body after ``QUIVER_ADMISSION_MAX_WAIT_S``; when ``QUIVER_ADMISSION_MAX_QUEUE`` requests
  already wait, the newest request of the tenant with the highest counter is shed instead (or the newcomer, if that
  is its own tenant).
- **Across processes.** Queues are per process; VTC counters are shared in the Redis hash ``quiver:vtc:served``
  (tenant id → weighted tokens), flushed and re-read each tick. Trade-off: no Redis round trip on any request and
  no distributed queue to lose or lock, and a tenant's service through any process lowers its standing in all of
  them; but ordering is exact only within one process, so with an unbalanced spread of tenants over processes the
  guarantee weakens to "fair per process, counters global". Lifts on re-entry (VTC's catch-up to the backlog's
  minimum) are kept per process, since each process knows only its own backlog.
- **Running slots.** With ``QUIVER_ADMISSION_NODE_SLOTS`` > 0 a node also counts as full once that many requests are in
  flight on it from all gateway processes, and one tenant may hold at most ``slots - QUIVER_ADMISSION_SLOT_RESERVE``
  of them (``inference.policy.admission.slot_free``). This process's holds are exact; the other processes' come from
  Redis (``quiver:slots:proc:<id>``, published and re-read each tick, so they are at most a tick old). A hold is
  released when its request ends (or after the proxy timeout, should its end never be seen), and a release wakes the
  dispatcher at once, so a freed slot goes to the next request in VTC order without waiting for the tick.
- **Start spacing.** With a slot budget, while other tenants are active on a node its heaviest tenant starts at
  most one request there per ``QUIVER_ADMISSION_START_SPACING_S`` (``inference.policy.admission.start_spaced``).
- **Coarse chunks for the heaviest tenant.** While other tenants are active on a node, a stream of the tenant holding
  most of its running requests asks vLLM for ``QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL`` tokens per chunk
  (``inference.policy.admission.stream_interval``): the node's host builds, relays and meters fewer chunks.
- **Unknown figures** (no agent publishing, Redis away, older than 250 ms) are not saturated: admit (fail open).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from common.redis import async_client
from inference.gateway import metrics
from inference.gateway.errors import GatewayError
from inference.gateway.loadboard import LoadBoard
from inference.gateway.snapshot import FleetView, NodeView
from inference.policy.admission import (
    SaturationConfig,
    SlotConfig,
    node_saturated,
    nodes_calm,
    slot_free,
    start_spaced,
    stream_interval,
    vtc_cost,
    vtc_lift,
    vtc_pick,
)

logger = logging.getLogger(__name__)
COUNTERS_KEY = "quiver:vtc:served"
SLOTS_PROCS_KEY = "quiver:slots:procs"
SLOTS_PROC_PREFIX = "quiver:slots:proc:"
SLOTS_TTL_S = 3.0
RETRY_AFTER_S = 2
CHOOSE_TIMEOUT_S = 0.5
IDLE_S = 5.0
# A tenant whose last request on a node ended this recently still counts for the node's fair share of slots: a
# steady tenant's queue empties between requests, and a flooder must not take its share in that gap.
ACTIVE_GRACE_S = 2.0
IDLE_TICK_S = 1.0  # the loop's tick while resting: a request, a queued waiter or a freed slot wakes it at once
STARTS_KEPT = 256  # remembered starts per node before the old ones are dropped
CALM_FACTOR = 4  # ticks this many times slower while every node is calm and nothing waits here (nodes_calm)
_ADMITTED = metrics.ADMISSION.labels("admitted")


@dataclass(eq=False)
class Waiter:
    """One queued request: tenant, band, arrival order, how to (re)choose its node, and the future it waits on."""

    tenant: str
    priority: int
    seq: int
    cost: float
    choose: Callable[[], Awaitable[NodeView]]
    future: asyncio.Future[tuple[NodeView, int]] = field(repr=False)
    enqueued: float = 0.0
    lora: str | None = None


def _config() -> SaturationConfig:
    return SaturationConfig(queue_saturated=settings.QUIVER_ADMISSION_QUEUE_SATURATED,
                            kv_saturated=settings.QUIVER_ADMISSION_KV_SATURATED,
                            max_age_s=settings.QUIVER_ADMISSION_MAX_AGE_S)


def _slots() -> SlotConfig:
    return SlotConfig(slots=settings.QUIVER_ADMISSION_NODE_SLOTS, reserve=settings.QUIVER_ADMISSION_SLOT_RESERVE)


def _shed(message: str) -> GatewayError:
    headers = {"Retry-After": str(RETRY_AFTER_S), "retry-after-ms": str(RETRY_AFTER_S * 1000),
               "x-should-retry": "true"}
    return GatewayError(429, message, code="engine_overloaded", type_="requests", headers=headers)


class AdmissionGate:
    """One per gateway process (and event loop)."""

    def __init__(self) -> None:
        self.board = LoadBoard()
        self.queues: dict[str, deque[Waiter]] = {}
        self.depth = 0
        self.seq = 0
        self.served: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.offset: dict[str, float] = {}
        self._redis: Any = None
        self._failing = False
        self._names: tuple[str, ...] = ()
        self._fleet_seen: FleetView | None = None
        self._routed_at = 0.0
        # Running-slot holds: this process's (token -> node, tenant, expiry) and counts, the others' from Redis.
        self.proc_id = uuid.uuid4().hex
        self._tokens = itertools.count(1)
        self._held: dict[int, tuple[str, str, float]] = {}
        self.holding: dict[str, Counter[str]] = {}
        self.others: dict[str, Counter[str]] = {}
        self._released: dict[str, dict[str, float]] = {}  # node -> tenant -> monotonic time of its last release
        self._started: dict[str, dict[str, float]] = {}  # node -> tenant -> monotonic time of its last start here
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._synced_at = 0.0

    @property
    def config(self) -> SaturationConfig:
        """Thresholds from settings, read on each use (operators and tests may change them at run time)."""
        return _config()

    # --- VTC counters
    def counter(self, tenant: str) -> float:
        """The tenant's weighted served-token counter as this process sees it (shared + unflushed + lifts)."""
        return self.served.get(tenant, 0.0) + self.pending.get(tenant, 0.0) + self.offset.get(tenant, 0.0)

    def charge(self, tenant: str, *, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Add served tokens to the tenant's counter (flushed to Redis in the background); negative counts settle
        an estimate charged on release."""
        self._charge_cost(tenant, vtc_cost(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))

    def _charge_cost(self, tenant: str, cost: float) -> None:
        if cost:
            self.pending[tenant] = self.pending.get(tenant, 0.0) + cost

    # --- the request path
    def fleet_view(self, fleet: FleetView) -> FleetView:
        """``fleet`` with fresh published figures in place of heartbeat gauges (what routing should see); also
        tells the background loop which nodes to follow, waking it at once after its idle rest or when the nodes
        change (else the next requests would decide on figures a rest or a slow tick old)."""
        now = time.monotonic()
        wake = now - self._routed_at >= IDLE_S
        self._routed_at = now
        if fleet is not self._fleet_seen:
            self._fleet_seen = fleet
            names = tuple(n.name for n in fleet.nodes)
            wake = wake or names != self._names
            self._names = names
        if wake:
            self._synced_at = float("-inf")  # the woken loop syncs at once, not at its next slow tick
            self._kick.set()
        return self.board.overlay(fleet, now_s=time.time(), max_age_s=self.config.max_age_s)

    def engine_priority(self, node: NodeView, priority: int) -> int | None:
        """The ``priority`` to send ``node``'s engine, or None to send none (band 0, or an engine on ``fcfs``,
        which refuses a non-zero priority)."""
        if not priority:
            return None
        load = self.board.get(node.name)
        return priority if load is not None and load.scheduling_policy == "priority" else None

    async def admit(self, *, tenant: str, priority: int, prompt_tokens: int, completion_tokens: int = 0,
                    choose: Callable[[], Awaitable[NodeView]]) -> NodeView:
        """:meth:`acquire` without the hold's token (callers that never release: tests)."""
        node, _ = await self.acquire(tenant=tenant, priority=priority, prompt_tokens=prompt_tokens,
                                     completion_tokens=completion_tokens, choose=choose)
        return node

    async def acquire(self, *, tenant: str, priority: int, prompt_tokens: int, completion_tokens: int = 0,
                      choose: Callable[[], Awaitable[NodeView]], lora: str | None = None) -> tuple[NodeView, int]:
        """The node to send the request to, now or after waiting its fair turn, and the token of its running-slot
        hold, which the caller hands to :meth:`release` when the request ends.

        Args:
            tenant: the fairness key (tenant id).
            priority: the band (lower first).
            prompt_tokens: the estimated prompt, charged to the tenant's counter on release.
            completion_tokens: the completion budget (``max_tokens`` × ``n``), also charged on release and settled
                by the caller at the end. Charging only finished output let a flood with long answers in flight
                look as cheap as a quiet tenant, so the quiet one was served no sooner (bench_fairness).
            choose: the gateway's node choice (may raise ``GatewayError``).
            lora: the adapter's served name (None for the base model): routing counts it in the node's running
                batch until the node's next published figures (``LoadBoard.note_sent``).

        Raises:
            GatewayError: what ``choose`` raises; 429 ``engine_overloaded`` with ``Retry-After`` when the wait or the
                queue bound is exceeded.
        """
        node = await choose()
        if (not self.depth or self._first_in_line(tenant, priority)) and self._may_go(node.name, tenant, time.time(),
                                                                                       sent_since=0):
            self._lift_on_arrival(tenant)
            self.board.note_sent(node.name, lora=lora)
            self.charge(tenant, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            _ADMITTED.inc()
            return node, self._hold(node.name, tenant)
        return await self._wait(tenant, priority, vtc_cost(prompt_tokens=prompt_tokens,
                                                           completion_tokens=completion_tokens), choose, lora)

    def _first_in_line(self, tenant: str, priority: int) -> bool:
        """Whether the dispatcher would release ``tenant``'s new request before every queued one: it has none queued,
        is serving now (so no VTC lift applies) and ranks strictly first by (band, counter). Such a request skips the
        queue: queued behind a backlog it could only wait for the dispatcher's next round (a Redis sync first), which
        under a flood added to every quiet request's TTFT (scripts/bench_fairness)."""
        if self.queues.get(tenant) or not self._active(tenant):
            return False
        mine = (priority, self.counter(tenant))
        return all(mine < (q[0].priority, self.counter(t)) for t, q in self.queues.items() if q and t != tenant)

    # --- running slots
    def _may_go(self, node: str, tenant: str, now: float, *, sent_since: int) -> bool:
        if node_saturated(self.board.get(node), now_s=now, config=self.config, sent_since=sent_since) is True:
            return False
        slots = _slots()
        if slots.slots <= 0:  # no running-slot budget: neither slots nor start spacing apply
            return True
        own, others, node_total = self._activity(node, tenant)
        started = self._started.get(node, {}).get(tenant)
        if start_spaced(since_start_s=None if started is None else time.monotonic() - started,
                        spacing_s=settings.QUIVER_ADMISSION_START_SPACING_S, tenant_in_flight=own,
                        others_in_flight=others):
            return False
        return slot_free(node_in_flight=node_total, tenant_in_flight=own, config=slots,
                         active_tenants=len(others) + 1)

    def _activity(self, node: str, tenant: str) -> tuple[int, list[int], int]:
        """(``tenant``'s running requests on ``node``, each other active tenant's there, the node's total): active =
        holding requests there (this process's holds, the others' from Redis), queued here, or ended one there in
        the last ``ACTIVE_GRACE_S``."""
        mine, theirs = self.holding.get(node), self.others.get(node)

        def held(t: str) -> int:
            return (mine[t] if mine else 0) + (theirs[t] if theirs else 0)

        active = {t for t, q in self.queues.items() if q}
        active.update(t for counts in (mine, theirs) if counts for t, n in counts.items() if n > 0)
        recent = self._released.get(node)
        if recent:
            horizon = time.monotonic() - ACTIVE_GRACE_S
            for t in [t for t, at in recent.items() if at < horizon]:
                del recent[t]
            active.update(recent)
        active.discard(tenant)
        node_total = (sum(mine.values()) if mine else 0) + (sum(theirs.values()) if theirs else 0)
        return held(tenant), [held(t) for t in active], node_total

    def engine_stream_interval(self, node: NodeView, tenant: str) -> int | None:
        """vLLM's ``stream_interval`` for a stream ``tenant`` just started on ``node`` (its hold counted), or None
        for a chunk per token: coarse chunks for the node's heaviest tenant while others are active there
        (``inference.policy.admission.stream_interval``, ``QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL``)."""
        own, others, _ = self._activity(node.name, tenant)
        return stream_interval(tenant_in_flight=own, others_in_flight=others,
                               coarse=settings.QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL)

    @staticmethod
    def hold_s() -> float:
        """Seconds a running-slot hold lives from its start or last :meth:`renew` (the same as the limiter's
        concurrency lease): released then should its request's end never be seen."""
        return settings.QUIVER_PROXY_TIMEOUT_S + settings.QUIVER_WARM_WAIT_S

    def renew(self, token: int) -> None:
        """Push a running hold's expiry ``hold_s()`` past now (a stream still relayed); a released one stays
        released."""
        entry = self._held.get(token)
        if entry is not None:
            self._held[token] = (entry[0], entry[1], time.monotonic() + self.hold_s())

    def _hold(self, node: str, tenant: str) -> int:
        token = next(self._tokens)
        self._held[token] = (node, tenant, time.monotonic() + self.hold_s())
        self.holding.setdefault(node, Counter())[tenant] += 1
        starts = self._started.setdefault(node, {})
        now = starts[tenant] = time.monotonic()
        if len(starts) > STARTS_KEPT:  # only the last spacing's starts matter
            spacing = settings.QUIVER_ADMISSION_START_SPACING_S
            for t in [t for t, at in starts.items() if now - at >= spacing]:
                del starts[t]
        return token

    def release(self, token: int) -> None:
        """End a running-slot hold (idempotent) and wake the dispatcher, so a waiting request takes the slot now."""
        entry = self._held.pop(token, None)
        if entry is None:
            return
        node, tenant, _ = entry
        self.board.note_done(node)
        self._released.setdefault(node, {})[tenant] = time.monotonic()
        counts = self.holding.get(node)
        if counts is not None:
            counts[tenant] -= 1
            if counts[tenant] <= 0:
                del counts[tenant]
            if not counts:
                del self.holding[node]
        if self.depth:
            self._kick.set()

    def _sweep(self) -> None:
        now = time.monotonic()
        for token in [t for t, (_, _, expires) in self._held.items() if expires < now]:
            self.release(token)

    async def _wait(self, tenant: str, priority: int, cost: float,
                    choose: Callable[[], Awaitable[NodeView]], lora: str | None = None) -> tuple[NodeView, int]:
        if self.depth >= settings.QUIVER_ADMISSION_MAX_QUEUE and not self._shed_for(tenant):
            metrics.ADMISSION.labels("shed").inc()
            raise _shed(f"The gateway's queue is full ({self.depth} requests wait for saturated nodes); retry in "
                        f"{RETRY_AFTER_S}s.")
        self._lift_on_arrival(tenant)
        queue = self.queues.setdefault(tenant, deque())
        self.seq += 1
        waiter = Waiter(tenant, priority, self.seq, cost, choose,
                        asyncio.get_running_loop().create_future(), time.monotonic(), lora)
        queue.append(waiter)
        self.depth += 1
        metrics.QUEUE_DEPTH.inc()
        metrics.ADMISSION.labels("queued").inc()
        self._kick.set()  # a free slot (or a fair turn) may be there already: the dispatcher decides now
        try:
            node, token = await asyncio.wait_for(waiter.future, timeout=settings.QUIVER_ADMISSION_MAX_WAIT_S)
        except TimeoutError:
            metrics.ADMISSION.labels("shed").inc()
            raise _shed(f"Every node serving this model is saturated; the request waited "
                        f"{settings.QUIVER_ADMISSION_MAX_WAIT_S:g}s. Retry in {RETRY_AFTER_S}s.") from None
        finally:
            self._remove(waiter)
            metrics.ADMISSION_WAIT.observe(time.monotonic() - waiter.enqueued)
        metrics.ADMISSION.labels("dequeued").inc()
        return node, token

    def _active(self, tenant: str) -> bool:
        """Whether ``tenant`` is being served: a running request in this process, or one that ended on some node
        within ``ACTIVE_GRACE_S`` (a steady tenant's queue and slots empty between its requests)."""
        if self._running(tenant):
            return True
        horizon = time.monotonic() - ACTIVE_GRACE_S
        return any(recent.get(tenant, horizon) > horizon for recent in self._released.values())

    def _lift_on_arrival(self, tenant: str) -> None:
        """VTC's lift for a tenant arriving from idle (nothing queued, not :meth:`_active`): its counter rises to
        the lowest among the tenants that are queued or active, so idle time earns no credit.

        VTC lifts to the queue's minimum, or to the last leaver's counter when the queue is empty (Sheng et al.,
        OSDI'24, Algorithm 2). Looking at queued tenants only left a flooder that started while a steady tenant's
        queue was empty at its own, lower, counter: it ranked first until its charges caught up (~20 requests, ~9 s
        of scripts/bench_fairness's first flood phase, worse in every run than the second)."""
        if self.queues.get(tenant) or self._active(tenant):
            return
        others = {t: self.counter(t) for t, q in self.queues.items() if q and t != tenant}
        horizon = time.monotonic() - ACTIVE_GRACE_S
        for counts in self.holding.values():
            others.update((t, self.counter(t)) for t, n in counts.items() if n > 0 and t != tenant)
        for recent in self._released.values():
            others.update((t, self.counter(t)) for t, at in recent.items() if at > horizon and t != tenant)
        own = self.counter(tenant)
        lifted = vtc_lift(own, others)
        if lifted > own:
            self.offset[tenant] = self.offset.get(tenant, 0.0) + lifted - own

    def _running(self, tenant: str) -> bool:
        """Whether ``tenant`` holds a running request in this process. A tenant whose queue emptied while its
        requests still run is being served, not idle: lifting it at each re-entry (as a strict reading of VTC's
        "not backlogged" does) put a steady small tenant level with a flooder and halved its share
        (scripts/bench_fairness)."""
        return any(counts.get(tenant) for counts in self.holding.values())

    def _remove(self, waiter: Waiter) -> None:
        queue = self.queues.get(waiter.tenant)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self.depth -= 1
            metrics.QUEUE_DEPTH.dec()
            if not queue:
                del self.queues[waiter.tenant]

    def _shed_for(self, tenant: str) -> bool:
        """Make room for ``tenant`` by shedding the newest request of the backlogged tenant with the highest
        counter, if that is another tenant with a higher counter. True when room was made."""
        backlogged = [t for t, q in self.queues.items() if q]
        if not backlogged:
            return False
        top = max(backlogged, key=self.counter)
        if top == tenant or self.counter(top) <= self.counter(tenant):
            return False
        victim = self.queues[top][-1]
        self._remove(victim)
        if not victim.future.done():
            victim.future.set_exception(_shed("The gateway's queue is full and your tenant has had the largest "
                                              f"share of service; retry in {RETRY_AFTER_S}s."))
        return True

    # --- background
    async def dispatch(self) -> int:
        """Release queued requests whose pool has room, in band/VTC order. Returns how many were released."""
        async with self._lock:  # the tick and a kick may both dispatch
            return await self._dispatch()

    async def _dispatch(self) -> int:
        released = 0
        blocked: set[str] = set()
        now = time.time()
        while self.depth:
            heads = {t: (q[0].priority, self.counter(t), q[0].seq) for t, q in self.queues.items()
                     if q and t not in blocked}
            tenant = vtc_pick(heads)
            if tenant is None:
                break
            waiter = self.queues[tenant][0]
            if waiter.future.done():
                self._remove(waiter)
                continue
            try:
                node = await asyncio.wait_for(waiter.choose(), CHOOSE_TIMEOUT_S)
            except GatewayError as exc:
                self._remove(waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
            except TimeoutError:
                blocked.add(tenant)
                continue
            if not self._may_go(node.name, tenant, now, sent_since=self.board.sent_since(node.name)):
                blocked.add(tenant)
                continue
            self._remove(waiter)
            if waiter.future.done():
                continue
            self.board.note_sent(node.name, lora=waiter.lora)
            self._charge_cost(tenant, waiter.cost)
            waiter.future.set_result((node, self._hold(node.name, tenant)))
            released += 1
        return released

    def _client(self) -> Any:
        if self._redis is None:
            self._redis = async_client(socket_timeout=1, connect_timeout=1)
        return self._redis

    async def sync(self, node_names: Iterable[str]) -> None:
        """One background tick's I/O: re-read node figures, flush local charges, re-read backlogged counters."""
        redis = self._client()
        if _slots().slots > 0:
            await self._sync_slots(redis)
        pending, self.pending = self.pending, {}
        backlogged = [t for t, q in self.queues.items() if q and t not in pending]
        # One round trip per tick: node figures, this process's charges and the backlogged counters together.
        wanted, keys = self.board.wanted(node_names)
        pipe = redis.pipeline(transaction=False)
        if keys:
            pipe.mget(keys)
        for tenant, amount in pending.items():
            pipe.hincrbyfloat(COUNTERS_KEY, tenant, amount)
        if backlogged:
            pipe.hmget(COUNTERS_KEY, backlogged)
        try:
            answers = await pipe.execute() if len(pipe) else []
        except Exception:
            for tenant, amount in pending.items():  # keep them for the next tick
                self.pending[tenant] = self.pending.get(tenant, 0.0) + amount
            raise
        self.board.apply(wanted, answers.pop(0) if keys else [])
        for tenant, total in zip(pending, answers, strict=False):
            self.served[tenant] = float(total)
        if backlogged:
            for tenant, total in zip(backlogged, answers[-1], strict=True):
                self.served[tenant] = float(total or 0.0)

    async def _sync_slots(self, redis: Any) -> None:
        """Publish this process's holds (node -> tenant -> count) and re-read every other live process's."""
        now = time.time()
        mine = json.dumps({node: dict(counts) for node, counts in self.holding.items()})
        pipe = redis.pipeline(transaction=False)
        pipe.set(SLOTS_PROC_PREFIX + self.proc_id, mine, px=int(SLOTS_TTL_S * 1000))
        pipe.zadd(SLOTS_PROCS_KEY, {self.proc_id: now})
        pipe.zremrangebyscore(SLOTS_PROCS_KEY, "-inf", now - SLOTS_TTL_S)
        pipe.zrange(SLOTS_PROCS_KEY, 0, -1)
        answers = await pipe.execute()
        ids = [p.decode() if isinstance(p, bytes) else str(p) for p in answers[-1]]
        ids = [p for p in ids if p != self.proc_id]
        others: dict[str, Counter[str]] = {}
        if ids:
            for raw in await redis.mget([SLOTS_PROC_PREFIX + p for p in ids]):
                try:
                    published = json.loads(raw) if raw else {}
                except ValueError:
                    continue
                for node, counts in published.items():
                    total = others.setdefault(node, Counter())
                    for tenant, n in counts.items():
                        total[tenant] += int(n)
        self.others = others

    def _gauges(self, names: Iterable[str]) -> None:
        now = time.time()
        states = [node_saturated(self.board.get(n), now_s=now, config=self.config) for n in names]
        metrics.NODES_SATURATED.set(sum(1 for s in states if s is True))
        metrics.NODES_UNKNOWN.set(sum(1 for s in states if s is None))

    async def run_forever(self) -> None:
        """Every ``QUIVER_ADMISSION_REFRESH_S``: sync with Redis, update gauges, dispatch. Never raises but
        cancellation; without a Redis URL only dispatches (every figure is then unknown, so nothing queues).

        Follows the nodes the request path last routed over (no database read of its own), and rests when this
        process has routed nothing for ``IDLE_S`` (the first request after that sees unknown figures: admitted).
        """
        while True:
            names = self._names
            tick_s = self._tick_s()
            busy = bool(self.depth or self.pending or self._held or time.monotonic() - self._routed_at < IDLE_S)
            try:
                due = time.monotonic() - self._synced_at >= tick_s
                if due:
                    self._synced_at = time.monotonic()
                    self._sweep()
                    if settings.QUIVER_GATEWAY_REDIS_URL and busy:
                        await self.sync(names)
                if self._failing:
                    logger.info("gateway.admission_sync_recovered")
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - figures just go stale (= unknown) until Redis is back
                if not self._failing:
                    logger.warning("gateway.admission_sync_failed", extra={"error": repr(exc)})
                self._failing = True
                self._redis = None
            self._gauges(names)
            self._kick.clear()  # before dispatching: a slot freed meanwhile wakes the next round
            try:
                await self.dispatch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop releasing requests forever
                logger.exception("gateway.admission_dispatch_failed", extra={"error": repr(exc)})
            # Until the next tick, or sooner when a request queues or a slot frees. Resting, ticks are rare: at 20
            # ticks a second an idle web process burnt ~50 ms CPU per second (scripts/bench_upload).
            try:
                await asyncio.wait_for(self._kick.wait(), timeout=tick_s if busy else max(tick_s, IDLE_TICK_S))
            except TimeoutError:
                pass

    def _tick_s(self) -> float:
        """``QUIVER_ADMISSION_REFRESH_S``, or ``CALM_FACTOR`` times it while nothing waits in this process, no
        running-slot budget is kept, and every node's figures are calm (``nodes_calm``): at concurrency 1 the
        50 ms tick cost about as much CPU as the requests themselves (py-spy under ``scripts/bench_gateway``)."""
        base = settings.QUIVER_ADMISSION_REFRESH_S
        if self.depth or _slots().slots > 0 or not nodes_calm(self.board.loads.values(), self.config):
            return base
        return base * CALM_FACTOR

