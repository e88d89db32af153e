"""The pure admission decisions: saturation with staleness and in-flight credit, VTC cost, lift and pick order."""

from __future__ import annotations

import pytest

from inference.policy.admission import (
    NodeLoad,
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

CONFIG = SaturationConfig()  # GIE's defaults: queue 5, KV 0.8; stale after 0.25 s


@pytest.mark.parametrize(("load", "sent", "expected"), [
    (NodeLoad(at_s=100.0, num_requests_waiting=4, kv_cache_usage_perc=0.79), 0, False),
    (NodeLoad(at_s=100.0, num_requests_waiting=5), 0, True),
    (NodeLoad(at_s=100.0, kv_cache_usage_perc=0.8), 0, True),
    (NodeLoad(at_s=100.0, num_requests_waiting=3), 2, True),  # sends since the scrape count as waiting
    (NodeLoad(at_s=100.0, num_requests_waiting=3), 1, False),
    (NodeLoad(at_s=100.0, num_requests_waiting=5), -1, False),  # a request ended since: one waiting one moved up
    # Waiting for a LoRA slot (deferred) is not a lack of capacity; only capacity waits count when reported.
    (NodeLoad(at_s=100.0, num_requests_waiting=7, waiting_capacity=0, waiting_deferred=7), 0, False),
    (NodeLoad(at_s=100.0, num_requests_waiting=7, waiting_capacity=5, waiting_deferred=2), 0, True),
    (NodeLoad(at_s=100.0, num_requests_waiting=7, waiting_capacity=3, waiting_deferred=4), 2, True),
])
def test_saturated_at_queue_5_or_kv_08_counting_unreported_sends(load: NodeLoad, sent: int, expected: bool) -> None:
    assert node_saturated(load, now_s=100.1, config=CONFIG, sent_since=sent) is expected


def test_ended_requests_never_count_below_an_empty_queue() -> None:
    hold_all = SaturationConfig(queue_saturated=0)  # what an operator (or a test) sets to hold every request
    assert node_saturated(NodeLoad(at_s=100.0), now_s=100.1, config=hold_all, sent_since=-2) is True
    assert node_saturated(NodeLoad(at_s=100.0, num_requests_waiting=1), now_s=100.1, config=CONFIG,
                          sent_since=-3) is False


def test_missing_or_stale_figures_are_unknown_not_saturated() -> None:
    full = NodeLoad(at_s=100.0, num_requests_waiting=50, kv_cache_usage_perc=1.0)

    assert node_saturated(None, now_s=100.0, config=CONFIG) is None
    assert node_saturated(full, now_s=100.25, config=CONFIG) is True
    assert node_saturated(full, now_s=100.26, config=CONFIG) is None


def test_thresholds_come_from_the_config() -> None:
    load = NodeLoad(at_s=0.0, num_requests_waiting=1, kv_cache_usage_perc=0.5)

    assert node_saturated(load, now_s=0.0, config=SaturationConfig(queue_saturated=1)) is True
    assert node_saturated(load, now_s=0.0, config=SaturationConfig(kv_saturated=0.5)) is True
    assert node_saturated(load, now_s=0.0, config=SaturationConfig(queue_saturated=2, kv_saturated=0.6)) is False


def test_cost_prices_output_twice_input_over_the_weight() -> None:
    assert vtc_cost(prompt_tokens=10, completion_tokens=5) == 20.0
    assert vtc_cost(prompt_tokens=10, completion_tokens=5, weight=2.0) == 10.0


def test_lift_raises_a_returning_tenant_to_the_backlogs_minimum_and_never_lowers() -> None:
    assert vtc_lift(3.0, {"a": 100.0, "b": 40.0}) == 40.0
    assert vtc_lift(70.0, {"a": 100.0, "b": 40.0}) == 70.0
    assert vtc_lift(3.0, {}) == 3.0


def test_pick_strict_band_then_lowest_counter_then_arrival() -> None:
    assert vtc_pick({}) is None
    assert vtc_pick({"flood": (0, 900.0, 1), "quiet": (0, 10.0, 50)}) == "quiet"
    assert vtc_pick({"flood": (-1, 900.0, 1), "quiet": (0, 10.0, 50)}) == "flood"  # a higher band goes first
    assert vtc_pick({"a": (0, 10.0, 7), "b": (0, 10.0, 3)}) == "b"


def test_slot_budget_keeps_a_reserve_no_single_tenant_may_take() -> None:
    budget = SlotConfig(slots=8, reserve=2)
    assert slot_free(node_in_flight=5, tenant_in_flight=5, config=budget)
    assert not slot_free(node_in_flight=6, tenant_in_flight=6, config=budget)  # the flooder stops at 6 of 8
    assert slot_free(node_in_flight=7, tenant_in_flight=1, config=budget)  # another tenant takes the reserve
    assert not slot_free(node_in_flight=8, tenant_in_flight=0, config=budget)  # the node is full
    assert slot_free(node_in_flight=0, tenant_in_flight=0, config=SlotConfig(slots=1, reserve=5))  # at least 1
    assert slot_free(node_in_flight=999, tenant_in_flight=999, config=SlotConfig())  # no budget
    # Others active: at most an equal share (max-min), never above the lone cap, at least 1.
    assert not slot_free(node_in_flight=4, tenant_in_flight=4, config=budget, active_tenants=2)  # 4 of 8 is half
    assert slot_free(node_in_flight=4, tenant_in_flight=3, config=budget, active_tenants=2)
    assert not slot_free(node_in_flight=3, tenant_in_flight=3, config=budget, active_tenants=3)  # ceil(8/3) = 3
    assert not slot_free(node_in_flight=6, tenant_in_flight=6, config=budget, active_tenants=1)  # alone: 6
    assert slot_free(node_in_flight=7, tenant_in_flight=0, config=budget, active_tenants=20)


def test_the_heaviest_tenant_on_a_node_is_spaced_while_others_are_active() -> None:
    def spaced(since: float | None, mine: int, others: list[int], spacing: float = 0.05) -> bool:
        return start_spaced(since_start_s=since, spacing_s=spacing, tenant_in_flight=mine, others_in_flight=others)

    assert spaced(0.01, 3, [1])  # a flooder that just started one waits out the spacing
    assert spaced(0.01, 1, [1])  # level with the other: still the heaviest
    assert spaced(0.01, 2, [0])  # the other is active (just finished, or queued) with nothing running
    assert not spaced(0.06, 3, [1])  # the spacing has passed
    assert not spaced(0.01, 3, [])  # alone on the node: never spaced
    assert not spaced(0.01, 1, [3])  # a lighter tenant than a flooder goes at once
    assert not spaced(None, 3, [1])  # no start remembered
    assert not spaced(0.01, 3, [1], spacing=0.0)  # off


def test_only_the_heaviest_tenant_on_a_node_streams_in_coarse_chunks_while_others_are_active() -> None:
    def interval(mine: int, others: list[int], coarse: int = 8) -> int | None:
        return stream_interval(tenant_in_flight=mine, others_in_flight=others, coarse=coarse)

    assert interval(4, [1]) == 8  # a flooder beside a quiet tenant
    assert interval(2, [0, 1]) == 8  # the others active (just finished, or queued) with little running
    assert interval(1, [4]) is None  # the quiet tenant keeps a chunk per token
    assert interval(2, [2]) is None  # level: neither is heavier
    # One stream is no flood: two tenants streaming one at a time, each starting while the other's last request
    # ended within the grace (active, nothing running), kept getting 8-token chunks in turn.
    assert interval(1, [0]) is None
    assert interval(1, [0, 0]) is None
    assert interval(5, []) is None  # alone on the node
    assert interval(4, [1], coarse=1) is None  # off


@pytest.mark.parametrize(("loads", "calm"), [
    ([], True),  # nothing known: unknown admits anyway
    ([NodeLoad(at_s=1.0, num_requests_running=30, kv_cache_usage_perc=0.39)], True),
    ([NodeLoad(at_s=1.0), NodeLoad(at_s=1.0, num_requests_waiting=1)], False),
    ([NodeLoad(at_s=1.0, kv_cache_usage_perc=0.4)], False),  # half of GIE's 0.8 mark
])
def test_nodes_are_calm_with_nothing_waiting_and_kv_under_half_the_mark(loads: list[NodeLoad], calm: bool) -> None:
    assert nodes_calm(loads, CONFIG) is calm
