"""The admission gate (one gateway process): fast path, fair release order, lift, bounded wait and queue, Redis sync."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from dataclasses import asdict
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from inference.gateway.admission import COUNTERS_KEY, AdmissionGate
from inference.gateway.errors import GatewayError
from inference.gateway.snapshot import FleetView, NodeView
from inference.node.load_publisher import load_key
from inference.policy.admission import NodeLoad

NODE = NodeView(pk=1, name="n1", engine_url="http://n1", base_model_id=1)


@pytest.fixture(autouse=True)
def _no_start_spacing(settings: Any) -> None:
    settings.QUIVER_ADMISSION_START_SPACING_S = 0.0  # each test below back-to-back starts; the last one spaces


async def _choose() -> NodeView:
    return NODE


def _load(**figures: float) -> NodeLoad:
    return NodeLoad(at_s=time.time(), **figures)  # type: ignore[arg-type]


def test_unsaturated_or_unknown_nodes_admit_at_once() -> None:
    async def run() -> None:
        gate = AdmissionGate()
        assert await gate.admit(tenant="a", priority=0, prompt_tokens=10, choose=_choose) is NODE  # no figures
        gate.board.loads = {"n1": _load(num_requests_waiting=4)}
        assert await gate.admit(tenant="a", priority=0, prompt_tokens=10, choose=_choose) is NODE
        gate.board.loads = {"n1": NodeLoad(at_s=time.time() - 1, num_requests_waiting=99)}  # stale
        assert await gate.admit(tenant="a", priority=0, prompt_tokens=10, choose=_choose) is NODE
        assert gate.depth == 0 and gate.pending["a"] == 30.0  # three prompts charged

    asyncio.run(run())


def test_saturated_requests_wait_and_leave_in_vtc_order(settings: Any) -> None:
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 5.0

    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"flood": 1000.0, "quiet": 0.0}
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        order: list[str] = []

        async def request(tenant: str) -> None:
            await gate.admit(tenant=tenant, priority=0, prompt_tokens=1, choose=_choose)
            order.append(tenant)

        tasks = [asyncio.create_task(request("flood")) for _ in range(3)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(request("quiet")))
        await asyncio.sleep(0.01)
        assert gate.depth == 4 and await gate.dispatch() == 0  # still saturated: nobody leaves
        # Room for one request per fresh figure (waiting 4 of 5). The quiet tenant joined a backlog, so it was lifted
        # to the flooder's counter (no credit for idle time); equal counters go FCFS, then each release charges the
        # flooder, so the quiet request leaves second, not fourth as in FCFS.
        for _ in range(4):
            gate.board.loads = {"n1": _load(num_requests_waiting=4)}
            assert await gate.dispatch() == 1
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        assert order == ["flood", "quiet", "flood", "flood"]

    asyncio.run(run())


def test_a_request_that_ends_hands_its_place_to_a_waiter_before_the_next_figures(settings: Any) -> None:
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 5.0

    async def run() -> None:
        gate = AdmissionGate()
        _, running = await gate.acquire(tenant="a", priority=0, prompt_tokens=1, choose=_choose)  # no figures yet
        await asyncio.sleep(0.002)
        gate.board.loads = {"n1": _load(num_requests_waiting=5)}  # taken after that send: saturated
        waiter = asyncio.create_task(gate.acquire(tenant="b", priority=0, prompt_tokens=1, choose=_choose))
        await asyncio.sleep(0.01)
        assert gate.depth == 1 and await gate.dispatch() == 0
        gate.release(running)  # its engine slot is free: one of the five waiting there runs now
        assert gate._kick.is_set() and await gate.dispatch() == 1  # the loop's wake-up, without new figures
        node, _ = await asyncio.wait_for(waiter, 1.0)
        assert node is NODE and gate.depth == 0
        assert gate.board.sent_since("n1") == 0  # the ended one and the one just sent, both after the figures

    asyncio.run(run())


def test_higher_band_leaves_before_a_lower_counter() -> None:
    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"vip": 1000.0, "quiet": 0.0}
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        quiet = asyncio.create_task(gate.admit(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose))
        vip = asyncio.create_task(gate.admit(tenant="vip", priority=-1, prompt_tokens=1, choose=_choose))
        await asyncio.sleep(0.01)
        gate.board.loads = {"n1": _load(num_requests_waiting=4)}
        assert await gate.dispatch() == 1
        await asyncio.sleep(0.01)
        assert vip.done() and not quiet.done()
        quiet.cancel()

    asyncio.run(run())


def test_a_tenant_back_from_idle_is_lifted_to_the_backlogs_minimum() -> None:
    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"busy": 500.0, "busier": 800.0, "idle": 3.0}
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        waiting = [asyncio.create_task(gate.admit(tenant=t, priority=0, prompt_tokens=1, choose=_choose))
                   for t in ("busy", "busier", "idle")]
        await asyncio.sleep(0.01)
        assert gate.counter("idle") == 500.0 and gate.counter("busier") == 800.0
        for task in waiting:
            task.cancel()

    asyncio.run(run())


def test_a_tenant_with_requests_still_running_is_not_lifted_on_re_entry() -> None:
    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"flood": 800.0, "steady": 3.0}
        node = await gate.admit(tenant="steady", priority=0, prompt_tokens=1, choose=_choose)  # runs, unqueued
        assert node is NODE and gate._running("steady")
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        waiting = [asyncio.create_task(gate.admit(tenant=t, priority=0, prompt_tokens=1, choose=_choose))
                   for t in ("flood", "steady")]
        await asyncio.sleep(0.01)
        assert gate.counter("steady") == 4.0  # its own service only (3 + the 1-token prompt), not the flooder's 800
        for task in waiting:
            task.cancel()

    asyncio.run(run())


def test_the_wait_is_bounded_and_ends_in_an_openai_429(settings: Any) -> None:
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 0.05

    async def run() -> None:
        gate = AdmissionGate()
        gate.board.loads = {"n1": _load(kv_cache_usage_perc=0.95)}
        with pytest.raises(GatewayError) as err:
            await gate.admit(tenant="a", priority=0, prompt_tokens=1, choose=_choose)
        exc = err.value
        assert (exc.status, exc.code, exc.type) == (429, "engine_overloaded", "requests")
        assert exc.headers["Retry-After"] == "2" and "saturated" in exc.message
        assert gate.depth == 0 and not gate.queues

    asyncio.run(run())


def test_a_full_queue_sheds_the_heaviest_tenants_newest_request(settings: Any) -> None:
    settings.QUIVER_ADMISSION_MAX_QUEUE = 2

    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"flood": 1000.0, "quiet": 0.0}
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        floods = [asyncio.create_task(gate.admit(tenant="flood", priority=0, prompt_tokens=1, choose=_choose))
                  for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(GatewayError):  # the flooder cannot push out its own requests
            await gate.admit(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
        quiet = asyncio.create_task(gate.admit(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose))
        await asyncio.sleep(0.01)
        assert floods[1].done() and isinstance(floods[1].exception(), GatewayError)
        assert not floods[0].done() and not quiet.done() and gate.depth == 2
        for task in (floods[0], quiet):
            task.cancel()

    asyncio.run(run())


def test_a_client_that_goes_away_leaves_the_queue() -> None:
    async def run() -> None:
        gate = AdmissionGate()
        gate.board.loads = {"n1": _load(num_requests_waiting=9)}
        task = asyncio.create_task(gate.admit(tenant="a", priority=0, prompt_tokens=1, choose=_choose))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        assert gate.depth == 0 and not gate.queues

    asyncio.run(run())


def test_routing_sees_fresh_figures_in_place_of_heartbeat_gauges() -> None:
    gate = AdmissionGate()
    fleet = FleetView(nodes=(NODE, NodeView(pk=2, name="n2", engine_url="http://n2", base_model_id=1)))
    gate.board.loads = {"n1": _load(num_requests_waiting=7, kv_cache_usage_perc=0.5)}
    gate.board.version += 1

    view = gate.fleet_view(fleet)

    assert (view.nodes[0].num_requests_waiting, view.nodes[0].kv_cache_usage_perc) == (7, 0.5)
    assert view.nodes[1] is fleet.nodes[1]
    assert gate.fleet_view(fleet) is view  # cached until figures change


def test_engine_priority_only_for_priority_engines() -> None:
    gate = AdmissionGate()
    assert gate.engine_priority(NODE, 1) is None  # no figures: the engine may run fcfs, which refuses it
    gate.board.loads = {"n1": NodeLoad(at_s=0.0, scheduling_policy="priority")}
    assert gate.engine_priority(NODE, 1) == 1 and gate.engine_priority(NODE, 0) is None
    gate.board.loads = {"n1": NodeLoad(at_s=0.0, scheduling_policy="fcfs")}
    assert gate.engine_priority(NODE, -1) is None


def test_sync_reads_published_figures_and_shares_counters_through_redis() -> None:
    node = f"gate-test-{uuid.uuid4().hex[:8]}"
    tenant = f"t-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        redis = aioredis.Redis.from_url(settings.QUIVER_GATEWAY_REDIS_URL)
        try:
            await redis.set(load_key(node), json.dumps(asdict(_load(num_requests_waiting=6))), px=5000)
            first, second = AdmissionGate(), AdmissionGate()  # two gateway processes
            first.charge(tenant, prompt_tokens=10, completion_tokens=20)
            await first.sync([node])
            assert first.board.get(node) is not None and first.board.get(node).num_requests_waiting == 6  # type: ignore[union-attr]
            second.queues[tenant] = deque([object()])  # type: ignore[list-item]  # a backlog: counters get re-read
            await second.sync([node])
            assert second.served[tenant] == 50.0 and first.counter(tenant) == 50.0
        finally:
            await redis.hdel(COUNTERS_KEY, tenant)
            await redis.delete(load_key(node))
            await redis.aclose()

    asyncio.run(run())


def test_running_slots_hold_a_reserve_and_a_release_hands_the_slot_on(settings: Any) -> None:
    settings.QUIVER_ADMISSION_NODE_SLOTS, settings.QUIVER_ADMISSION_SLOT_RESERVE = 3, 1
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 5.0

    async def run() -> None:
        gate = AdmissionGate()
        loop = asyncio.get_running_loop().create_task(gate.run_forever())
        try:
            floods = [await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
                      for _ in range(2)]
            third = asyncio.create_task(gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose))
            await asyncio.sleep(0.02)
            assert gate.depth == 1 and not third.done()  # the flooder holds 2 of 3: the last slot is the reserve
            started = time.monotonic()
            quiet_node, quiet_slot = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1,
                                                        choose=_choose)
            assert quiet_node is NODE and time.monotonic() - started < 0.04  # at once, without waiting a tick
            gate.release(floods[0][1])
            gate.release(floods[0][1])  # idempotent
            node, _ = await asyncio.wait_for(third, 0.04)  # the freed slot goes to the waiter at once
            assert node is NODE and gate.holding == {"n1": {"flood": 2, "quiet": 1}}
            gate.release(quiet_slot)
            assert gate.holding == {"n1": {"flood": 2}}
        finally:
            loop.cancel()

    asyncio.run(run())


def test_other_processes_slots_count_through_redis(settings: Any) -> None:
    settings.QUIVER_ADMISSION_NODE_SLOTS, settings.QUIVER_ADMISSION_SLOT_RESERVE = 2, 0

    node = NodeView(pk=2, name=f"n-{uuid.uuid4().hex}", engine_url="http://n2", base_model_id=1)

    async def choose() -> NodeView:
        return node

    async def run() -> None:
        first, second = AdmissionGate(), AdmissionGate()
        await first.admit(tenant="a", priority=0, prompt_tokens=1, choose=choose)
        await second.admit(tenant="b", priority=0, prompt_tokens=1, choose=choose)
        for gate in (first, second, first):
            await gate.sync([node.name])
        assert first.others.get(node.name) == {"b": 1} and second.others.get(node.name) == {"a": 1}
        blocked = asyncio.create_task(first.admit(tenant="c", priority=0, prompt_tokens=1, choose=choose))
        await asyncio.sleep(0.02)
        assert first.depth == 1 and not blocked.done()  # 2 of 2 held across the two processes
        blocked.cancel()
        await first._client().delete(*(f"quiver:slots:proc:{g.proc_id}" for g in (first, second)))

    asyncio.run(run())


def test_the_tick_slows_only_while_every_node_is_calm_and_nothing_waits(settings: Any) -> None:
    settings.QUIVER_ADMISSION_REFRESH_S = 0.05
    settings.QUIVER_ADMISSION_NODE_SLOTS = 0
    gate = AdmissionGate()
    gate.board.loads = {"n1": _load(num_requests_running=3)}
    calm = gate._tick_s()
    gate.board.loads = {"n1": _load(num_requests_waiting=1)}
    near = gate._tick_s()
    gate.board.loads = {"n1": _load()}
    gate.depth = 1
    queued = gate._tick_s()
    gate.depth = 0
    settings.QUIVER_ADMISSION_NODE_SLOTS = 8  # slot holds of other processes must stay a tick old
    slots = gate._tick_s()
    assert (calm, near, queued, slots) == (pytest.approx(0.2), 0.05, 0.05, 0.05)


def test_a_request_after_the_idle_rest_wakes_the_loop_to_sync_at_once() -> None:
    gate = AdmissionGate()
    fleet = FleetView(nodes=(NODE,), placements={}, read_at=time.monotonic())
    gate.fleet_view(fleet)  # first routing ever: after a "rest" of forever
    assert gate._kick.is_set()
    gate._kick.clear()
    gate.fleet_view(fleet)  # busy, same nodes: the tick's own pace
    assert not gate._kick.is_set()
    gate._routed_at -= 10  # longer than the rest (IDLE_S 5 s)
    gate._synced_at = time.monotonic()
    gate.fleet_view(fleet)
    assert gate._kick.is_set()
    assert time.monotonic() - gate._synced_at >= 1e9  # the woken loop's sync is due at once, whatever the tick


def test_a_tenant_that_just_finished_keeps_its_fair_share_of_slots(settings: Any) -> None:
    settings.QUIVER_ADMISSION_NODE_SLOTS = 4
    settings.QUIVER_ADMISSION_SLOT_RESERVE = 0
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 0.05

    async def run() -> None:
        gate = AdmissionGate()
        _, token = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        gate.release(token)  # its queue and slots are empty for a moment, as between a steady tenant's requests
        for _ in range(2):  # half of 4 while the quiet tenant counts as active
            await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
        with pytest.raises(GatewayError):
            await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
        _, token = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)  # its share: free
        gate._released["n1"]["quiet"] -= 60  # long gone: the flooder may take all 4 again
        gate.release(token)
        gate._released["n1"]["quiet"] -= 60
        for _ in range(2):
            await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)

    asyncio.run(run())


def test_a_serving_tenant_ranked_first_skips_the_queue_of_a_backlog(settings: Any) -> None:
    """A flooder's backlog does not make a lighter tenant, already being served, queue behind it for a dispatcher
    round; one returning from idle (lifted level with the backlog) or ranking after it still queues."""
    settings.QUIVER_ADMISSION_NODE_SLOTS, settings.QUIVER_ADMISSION_SLOT_RESERVE = 4, 0
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 0.05

    async def run() -> None:
        gate = AdmissionGate()  # no run_forever: only the fast path can admit
        _, quiet_slot = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        for _ in range(2):  # the flooder's share of 4 while the quiet tenant is active
            await gate.acquire(tenant="flood", priority=0, prompt_tokens=100, choose=_choose)
        waiting = asyncio.create_task(gate.acquire(tenant="flood", priority=0, prompt_tokens=100, choose=_choose))
        await asyncio.sleep(0)
        assert gate.depth == 1
        node, _ = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        assert node is NODE and gate.depth == 1  # admitted at once, past the flooder's backlog
        gate.release(quiet_slot)
        with pytest.raises(GatewayError):  # a heavier tenant than the backlog's head waits its turn
            gate.pending["quiet"] = 1e6
            await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        with pytest.raises(GatewayError):
            await waiting

    asyncio.run(run())


def test_a_flooders_starts_are_spaced_only_while_another_tenant_is_active(settings: Any) -> None:
    """Starts taken together prefill together and end together (waves that hit a quiet tenant's TTFT): the heaviest
    tenant on a node starts at most one request per spacing while another tenant is active there."""
    settings.QUIVER_ADMISSION_NODE_SLOTS, settings.QUIVER_ADMISSION_SLOT_RESERVE = 16, 0
    settings.QUIVER_ADMISSION_START_SPACING_S = 0.1
    settings.QUIVER_ADMISSION_MAX_WAIT_S = 5.0

    async def run() -> None:
        gate = AdmissionGate()
        loop = asyncio.get_running_loop().create_task(gate.run_forever())
        try:
            t0 = time.monotonic()
            for _ in range(3):  # alone: back to back
                await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
            assert time.monotonic() - t0 < 0.05 and gate.depth == 0
            _, quiet_slot = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
            await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)  # lighter: not spaced
            assert gate.depth == 0
            gate._started["n1"]["flood"] = time.monotonic()  # it just started one
            t0 = time.monotonic()
            waits = [asyncio.create_task(gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose))
                     for _ in range(2)]
            await asyncio.sleep(0.05)
            assert gate.depth == 2 and not any(w.done() for w in waits)  # queued while the spacing runs
            await asyncio.wait_for(waits[0], 1.0)
            first = time.monotonic() - t0
            await asyncio.wait_for(waits[1], 1.0)
            second = time.monotonic() - t0
            assert 0.09 <= first < 0.4 and second - first >= 0.09  # one start per spacing, by the dispatcher
            gate.release(quiet_slot)
            settings.QUIVER_ADMISSION_NODE_SLOTS = 0  # no slot budget: no spacing either
            gate._started["n1"]["flood"] = time.monotonic()
            t0 = time.monotonic()
            await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose)
            assert time.monotonic() - t0 < 0.05
        finally:
            loop.cancel()

    asyncio.run(run())


def test_the_heaviest_tenants_streams_ask_the_engine_for_coarse_chunks_while_another_is_active(settings: Any) -> None:
    settings.QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL = 8

    async def run() -> None:
        gate = AdmissionGate()
        flood = [await gate.acquire(tenant="flood", priority=0, prompt_tokens=1, choose=_choose) for _ in range(3)]
        assert gate.engine_stream_interval(NODE, "flood") is None  # alone on the node: a chunk per token
        _, quiet = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        assert gate.engine_stream_interval(NODE, "flood") == 8
        assert gate.engine_stream_interval(NODE, "quiet") is None
        gate.release(quiet)  # the quiet tenant just finished: still active for ACTIVE_GRACE_S
        assert gate.engine_stream_interval(NODE, "flood") == 8
        gate._released["n1"]["quiet"] -= 10  # long gone
        assert gate.engine_stream_interval(NODE, "flood") is None
        settings.QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL = 1  # off
        await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        assert gate.engine_stream_interval(NODE, "flood") is None
        for _, slot in flood:
            gate.release(slot)
        settings.QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL = 8
        # The flooder's requests just ended (active, nothing running): the quiet tenant's one stream is no flood.
        assert gate.engine_stream_interval(NODE, "quiet") is None

    asyncio.run(run())


def test_a_renewed_hold_outlives_its_life_and_an_unrenewed_one_is_swept(settings: Any) -> None:
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 0.2, 0.0

    async def run() -> None:
        gate = AdmissionGate()
        _, renewed = await gate.acquire(tenant="a", priority=0, prompt_tokens=1, choose=_choose)
        await gate.acquire(tenant="b", priority=0, prompt_tokens=1, choose=_choose)  # its process never renews
        for _ in range(4):  # 0.4 s, twice a hold's life
            await asyncio.sleep(0.1)
            gate.renew(renewed)
        gate._sweep()
        assert dict(gate.holding["n1"]) == {"a": 1}
        gate.release(renewed)
        gate.renew(renewed)  # released: stays released
        assert "n1" not in gate.holding and renewed not in gate._held

    asyncio.run(run())


def test_a_newcomer_is_lifted_to_the_active_tenants_counter_even_with_nobody_queued() -> None:
    """VTC: idle time earns no credit. A flooder starting while a steady tenant is served (nothing queued) starts
    from the steady tenant's counter, not from its own lower one; the steady tenant, between two of its requests,
    is not idle and keeps its counter."""
    async def run() -> None:
        gate = AdmissionGate()
        gate.served = {"quiet": 4000.0, "flood": 0.0}
        _, token = await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        gate.release(token)  # its queue and slots are empty now, as between a steady tenant's requests
        await gate.acquire(tenant="flood", priority=0, prompt_tokens=10, choose=_choose)  # fast path, no queue
        assert gate.counter("flood") == 4001.0 + 10.0  # lifted to quiet's 4001, then charged its prompt
        await gate.acquire(tenant="quiet", priority=0, prompt_tokens=1, choose=_choose)
        assert gate.counter("quiet") == 4002.0  # not lifted: served 2 ms ago
        gate._released["n1"]["quiet"] -= 60  # long gone: a lone newcomer keeps its own counter
        gate.served["late"] = 7.0
        for counts in gate.holding.values():
            counts.clear()
        await gate.acquire(tenant="late", priority=0, prompt_tokens=1, choose=_choose)
        assert gate.counter("late") == 8.0

    asyncio.run(run())
