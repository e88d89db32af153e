from __future__ import annotations

import random

import pytest

from inference.policy.hrw import hrw_order, hrw_weight
from inference.policy.placement import Demand, PlacementConfig, PlacementNode, place, replicas_wanted


def nodes(n: int = 4, *, slots: int = 4, rank: int = 16, base: str = "m") -> list[PlacementNode]:
    return [PlacementNode(name=f"n{i}", base_model=base, max_lora_rank=rank, cpu_slots=slots) for i in range(n)]


def demand(v: int, rate: float, **kw: object) -> Demand:
    return Demand(version_id=v, base_model=str(kw.pop("base", "m")), r=int(kw.pop("r", 8)), size_bytes=1000,
                  rate=rate, **kw)  # type: ignore[arg-type]


def test_replicas_grow_with_rate_and_shrink_when_idle() -> None:
    cfg = PlacementConfig(replica_util=0.5, max_replicas=4)
    assert replicas_wanted(0.0, 10.0, config=cfg, eligible=4) == 1
    assert replicas_wanted(4.0, 10.0, config=cfg, eligible=4) == 1
    assert replicas_wanted(12.0, 10.0, config=cfg, eligible=4) == 3
    assert replicas_wanted(100.0, 10.0, config=cfg, eligible=4) == 4
    assert replicas_wanted(100.0, 10.0, config=cfg, eligible=2) == 2
    assert replicas_wanted(0.0, 10.0, config=cfg, min_replicas=2, eligible=4) == 2


def test_eligibility_base_model_rank_and_bytes() -> None:
    fleet = [PlacementNode("small", "m", 8, 4), PlacementNode("big", "m", 64, 4),
             PlacementNode("other", "x", 64, 4), PlacementNode("tiny", "m", 64, 4, cpu_bytes=500)]
    plan = place([demand(1, 1.0, r=32)], fleet)
    assert plan[1] == ("big",)
    assert place([demand(2, 1.0, base="nope")], fleet)[2] == ()


def test_hot_version_spread_and_load_bounded() -> None:
    demands = [demand(1, 50.0)] + [demand(v, 2.0) for v in range(2, 40)]
    plan = place(demands, nodes(4, slots=16))
    assert len(plan[1]) >= 2  # one node cannot carry it within the load bound
    load = {f"n{i}": 0.0 for i in range(4)}
    for d in demands:
        for name in plan[d.version_id]:
            load[name] += d.rate / len(plan[d.version_id])
    mean = sum(load.values()) / 4
    assert max(load.values()) <= 1.25 * mean + 1e-9


def test_cpu_slots_hold_distinct_top_versions() -> None:
    # 4 nodes × 4 slots: the 16 hottest versions (each well under a node's share) get 16 distinct slots.
    demands = [demand(v, 100.0 / v) for v in range(2, 60)]
    plan = place(demands, nodes(4, slots=4), config=PlacementConfig(max_replicas=1))
    per_node: dict[str, list[int]] = {}
    for d in sorted(demands, key=lambda d: -d.rate)[:16]:
        per_node.setdefault(plan[d.version_id][0], []).append(d.version_id)
    assert sorted(len(v) for v in per_node.values()) == [4, 4, 4, 4]


def test_extra_replicas_never_take_a_colder_versions_cpu_slot() -> None:
    # bench_fleet's case: 8 versions (Zipf 1.0) on 2 nodes x 4 CPU slots. The hottest wants 2 replicas by rate, but a
    # second one would push a colder version out of every CPU cache, to reload on each of its requests.
    demands = [demand(v, 60.0 / v) for v in range(1, 9)]
    plan = place(demands, nodes(2, slots=4))
    assert all(len(plan[v]) == 1 for v in range(1, 9))
    per_node = [sum(1 for v in range(1, 9) if f"n{i}" in plan[v]) for i in range(2)]
    assert per_node == [4, 4]
    # With CPU slots to spare, the same rates do get their extra replicas.
    roomy = place(demands, nodes(2, slots=8))
    assert len(roomy[1]) == 2 and len(roomy[2]) == 2


def test_over_subscribed_slots_replicate_only_what_outweighs_the_slot_it_takes() -> None:
    # bench_fleet's default: 16 versions (Zipf 1.0) over 2 nodes x 4 CPU slots. A second replica of the hottest would
    # take the slot of the 8th (~4 % of traffic), which then reloads on each request: not worth it (replica_worth).
    demands = [demand(v, 100.0 / v) for v in range(1, 17)]
    plan = place(demands, nodes(2, slots=4))
    assert all(len(plan[v]) == 1 for v in range(1, 17))
    assert [sum(1 for v in range(1, 9) if plan[v] == (f"n{i}",)) for i in range(2)] == [4, 4]
    # replica_worth 0 is the rule before it: the head is replicated into colder versions' slots.
    eager = place(demands, nodes(2, slots=4), config=PlacementConfig(replica_worth=0.0))
    assert len(eager[1]) == 2
    # 500 over 4 x 64 slots: the frontier carries ~0.06 % of traffic, so the head still gets its replicas.
    wide = place([demand(v, 100.0 / v) for v in range(1, 501)], nodes(4, slots=64))
    assert len(wide[1]) >= 2 and len(wide[2]) >= 2


def test_among_several_holders_the_previous_plans_node_keeps_the_version() -> None:
    # A round-robin front left the version in both engines; HRW alone would pick its first node on every re-plan
    # whatever the last plan said, and a version whose HRW-first node changed with the holders would flip.
    both, one = frozenset({"n0", "n1"}), PlacementConfig(max_replicas=1)
    hrw_first = place([demand(7, 1.0, resident_on=both)], nodes(2), config=one)[7][0]
    other = ({"n0", "n1"} - {hrw_first}).pop()
    kept = place([demand(7, 1.0, resident_on=both, planned_on=frozenset({other}))], nodes(2), config=one)
    assert kept[7] == (other,)
    # A holder still beats a previous home that lost the version (no load to stay), and a version held nowhere
    # keeps its HRW order.
    assert place([demand(7, 1.0, resident_on=frozenset({hrw_first}), planned_on=frozenset({other}))],
                 nodes(2), config=one)[7] == (hrw_first,)
    assert place([demand(7, 1.0, planned_on=frozenset({other}))], nodes(2), config=one)[7] == (hrw_first,)


def test_pins_come_first_and_plan_is_deterministic() -> None:
    demands = [demand(1, 0.0, pinned_nodes=frozenset({"n3"})), demand(2, 5.0), demand(3, 1.0)]
    a = place(demands, nodes())
    assert a[1][0] == "n3"
    assert a == place(list(reversed(demands)), list(reversed(nodes())))


@pytest.mark.parametrize("dropped", ["n0", "n1", "n2", "n3"])
def test_losing_a_node_moves_only_its_versions(dropped: str) -> None:
    demands = [demand(v, 0.0) for v in range(1, 200)]
    before = place(demands, nodes())
    after = place(demands, [n for n in nodes() if n.name != dropped])
    for v, names in before.items():
        if dropped not in names:
            assert after[v] == names


def test_slotted_pairs_fill_cpu_slots_pins_first_then_hottest() -> None:
    from inference.policy.placement import slotted

    fleet = nodes(2, slots=2)
    demands = [demand(1, 1.0, pinned_nodes=frozenset({"n0"})), demand(2, 9.0), demand(3, 5.0), demand(4, 3.0),
               demand(5, 0.5)]
    plan = {1: ("n0",), 2: ("n0", "n1"), 3: ("n1",), 4: ("n0",), 5: ("n1",)}
    assert slotted(plan, demands, fleet) == {(1, "n0"), (2, "n0"), (2, "n1"), (3, "n1")}
    assert slotted(plan, demands, nodes(2, slots=8)) == {(v, n) for v, names in plan.items() for n in names}


def test_miss_cost_spreads_the_reloads_of_versions_past_the_slot_frontier() -> None:
    # 16 over 2 x 4 slots: the 8 coldest reload on each request. Booked at rate x (1 + miss_cost), they split so
    # both nodes carry about the same work; booked at their rate alone, one node takes most of the reloads.
    demands = [demand(v, 100.0 / v) for v in range(1, 17)]

    def work(plan: dict[int, tuple[str, ...]], miss_cost: float) -> list[float]:
        return [sum(100.0 / v * (1 + (miss_cost if v > 8 else 0)) for v in range(1, 17) if plan[v] == (f"n{i}",))
                for i in range(2)]

    costed = work(place(demands, nodes(2, slots=4), config=PlacementConfig(miss_cost=3.0)), 3.0)
    plain = work(place(demands, nodes(2, slots=4)), 3.0)
    assert max(costed) / min(costed) < 1.05 < max(plain) / min(plain)


def test_miss_cost_counts_what_reloads_on_each_node_not_only_past_the_fleet_frontier() -> None:
    # Rates as a 240-request Zipf sample measures them (uneven), 16 over 2 x 4 slots. A node's versions past its
    # own 4 slots reload on each request even when they are hotter than the fleet's frontier; booking them as hits
    # left one node with a fifth more work than the other in some samples.
    ratios = []
    for seed in range(100):
        rng = random.Random(seed)
        counts = [0] * 16
        for v in rng.choices(range(16), [1 / (i + 1) for i in range(16)], k=240):
            counts[v] += 1
        rates = {v + 1: float(c) for v, c in enumerate(counts) if c}
        plan = place([demand(v, r) for v, r in rates.items()], nodes(2, slots=4),
                     config=PlacementConfig(miss_cost=3.0))
        work = []
        for i in range(2):
            held = sorted((r for v, r in rates.items() if f"n{i}" in plan[v]), reverse=True)
            work.append(sum(held[:4]) + 4 * sum(held[4:]))
        ratios.append(max(work) / (sum(work) / 2))
    assert sum(ratios) / len(ratios) < 1.03
    assert sorted(ratios)[90] < 1.08


def test_the_hottest_versions_go_at_most_max_loras_to_a_node() -> None:
    """bench_fleet's regime: 16 Zipf versions over 2 nodes × (2 batch slots, 4 CPU slots). Without batch slots in the
    plan, some seeds put three of the four hottest on one node, where vLLM's scheduler defers the third behind
    the other two; with them, each node's two slots serve two of the four."""
    zipf = [demand(v, 100.0 / v, r=8) for v in range(1, 17)]
    crowded = 0
    for seed in range(40):  # the HRW order changes with the version ids: shift them
        shifted = [Demand(d.version_id + 100 * seed, d.base_model, d.r, d.size_bytes, d.rate) for d in zipf]
        hottest = {d.version_id for d in shifted[:4]}
        fleet = [PlacementNode(f"n{i}", "m", 16, 4, gpu_slots=2) for i in range(2)]
        plan = place(shifted, fleet, config=PlacementConfig(miss_cost=1.0))
        for node in ("n0", "n1"):
            assert sum(1 for v in hottest if plan[v][0] == node) <= 2, (seed, plan)
        blind = place(shifted, [PlacementNode(f"n{i}", "m", 16, 4) for i in range(2)],
                      config=PlacementConfig(miss_cost=1.0))
        crowded += any(sum(1 for v in hottest if blind[v][0] == node) > 2 for node in ("n0", "n1"))
    assert crowded > 0  # the rule changes plans: without it some seeds crowd a node


def test_hrw_order_is_the_same_memoised_and_each_caller_gets_its_own_list() -> None:
    names = tuple(f"n{i}" for i in range(16))
    ranked = hrw_order(7, names)
    assert ranked == sorted(names, key=lambda n: -hrw_weight(7, n)) == hrw_order(7, list(names))
    ranked.reverse()  # place() reorders its copy: the memo must not change
    assert hrw_order(7, names) == sorted(names, key=lambda n: -hrw_weight(7, n))


def test_holders_come_first_the_previous_plans_holder_first_among_them_then_the_hrw_order() -> None:
    many = [PlacementNode(f"n{i}", "base", 16, 4) for i in range(6)]
    names = [n.name for n in many]
    order = sorted(names, key=lambda n: -hrw_weight(9, n))
    held = frozenset({order[4], order[2]})
    idle = place([Demand(9, "base", 8, 10, 0.0, min_replicas=6, resident_on=held,
                         planned_on=frozenset({order[4], order[1]}))], many)[9]
    assert idle == (order[4], order[2], order[0], order[1], order[3], order[5])
