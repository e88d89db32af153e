from __future__ import annotations

from inference.policy.hrw import hrw_order, hrw_weight
from inference.policy.routing import Candidate, RouteConfig, plan_candidates, route
from inference.policy.tiers import Tier


def cand(node: str, tier: Tier = Tier.COLD, *, used: int = 8, running: int = 0, waiting: int = 0, kv: float = 0.1,
         placed: bool = True, hrw: int | None = None) -> Candidate:
    return Candidate(node=node, tier=tier, gpu_slots=8, gpu_used=used, running=running, waiting=waiting,
                     kv_cache_usage_perc=kv, in_placement=placed, hrw=hrw_weight(7, node) if hrw is None else hrw)


def test_empty_is_none() -> None:
    assert route([]) is None


def test_tier_order_gpu_cpu_free_slot_disk_cold() -> None:
    gpu, cpu, free, disk = cand("a", Tier.GPU), cand("b", Tier.CPU), cand("c", used=3), cand("d", Tier.DISK)
    assert route([disk, free, cpu, gpu]).node == "a"
    assert route([disk, free, cpu]).node == "b"
    assert route([disk, free]).node == "c"
    assert route([cand("e"), disk]).node == "d"


def test_never_saturated_while_another_qualifies() -> None:
    hot_but_saturated = cand("a", Tier.GPU, waiting=5)
    kv_full = cand("b", Tier.GPU, kv=0.85)
    cold = cand("c")
    decision = route([hot_but_saturated, kv_full, cold])
    assert decision.node == "c" and not decision.saturated


def test_all_saturated_flags_and_takes_least_loaded() -> None:
    decision = route([cand("a", Tier.GPU, waiting=9), cand("b", waiting=6)])
    assert decision.saturated and decision.node == "b"


def test_bounded_load_skips_overloaded_resident() -> None:
    # 'a' holds the version in a GPU slot but carries far more than the mean: bounded load sends it elsewhere.
    overloaded = cand("a", Tier.GPU, running=40)
    decision = route([overloaded, cand("b", Tier.CPU, running=2), cand("c", running=2)],
                     config=RouteConfig(queue_saturated=100))
    assert decision.node == "b"


def test_equal_tier_balances_by_load_then_hrw() -> None:
    a, b = cand("a", Tier.GPU, running=3), cand("b", Tier.GPU, running=2)
    assert route([a, b]).node == "b"
    x, y = cand("x", Tier.GPU, hrw=1), cand("y", Tier.GPU, hrw=2)
    assert route([x, y]).node == "y" and route([y, x]).node == "y"  # deterministic, order-free


def test_in_engine_replicas_share_by_load() -> None:
    # A replicated version: its CPU-resident replica with the shorter queue beats the GPU one (a swap < a queue).
    assert route([cand("a", Tier.GPU, running=6), cand("b", Tier.CPU, running=2)]).node == "b"
    assert route([cand("a", Tier.GPU, running=2), cand("b", Tier.CPU, running=2)]).node == "a"
    assert route([cand("a", Tier.CPU, running=4), cand("b", Tier.DISK, running=0, used=3), cand("c", running=4)]).node == "a"


def test_placement_set_wins_over_spillover() -> None:
    assert route([cand("a", Tier.CPU, placed=False), cand("b", Tier.DISK)]).node == "b"


def test_errored_node_is_last_resort() -> None:
    assert route([cand("a", Tier.ERRORED), cand("b")]).node == "b"


def test_base_model_goes_where_lora_slots_are_least_busy() -> None:
    busy, calm = cand("a", used=8), cand("b", used=1)
    assert route([busy, calm], base_model=True).node == "b"


def test_hrw_order_stable_and_minimal_remap() -> None:
    nodes = [f"n{i}" for i in range(8)]
    before = {v: hrw_order(v, nodes)[0] for v in range(1000)}
    after = {v: hrw_order(v, nodes[:-1])[0] for v in range(1000)}
    moved = [v for v in before if before[v] != after[v]]
    assert all(before[v] == "n7" for v in moved)  # only the dropped node's keys move
    assert 60 < len(moved) < 200  # ≈ 1/8 of them


def test_round_robin_baseline_ignores_residency_and_takes_turns() -> None:
    from inference.policy.routing import route_round_robin

    pool = [cand("b", Tier.DISK), cand("a", Tier.GPU)]
    assert [route_round_robin(pool, turn=t).node for t in range(4)] == ["a", "b", "a", "b"]
    assert route([*pool]).node == "a"  # affinity always picks the resident node
    assert route_round_robin([], turn=3) is None
    assert route_round_robin([cand("a", waiting=9)], turn=0).saturated


def test_a_full_batch_at_home_loses_to_a_holder_with_room() -> None:
    # vLLM defers a request whose adapter is not among the max_loras of the running batch; a node that holds the
    # version (here on its disk, ~1 ms to load on the CPU node) and has room in its batch serves it now.
    home = cand("home", Tier.GPU, running=2)._replace(batch_full=True)
    spare = cand("spare", Tier.DISK, placed=False, running=2)
    assert route([home, spare]).node == "spare"
    assert route([home._replace(batch_full=False), spare]).node == "home"  # unknown or room: residency decides
    assert route([home, spare._replace(batch_full=True)]).node == "home"  # both full: as before


def test_among_in_engine_replicas_the_one_running_the_version_wins() -> None:
    a = cand("a", Tier.GPU, running=3)._replace(in_batch=True)
    b = cand("b", Tier.GPU, running=1)
    assert route([a, b]).node == "a"
    assert route([a._replace(in_batch=False), b]).node == "b"  # otherwise the less loaded


def test_plan_candidates_rank_homes_first_and_offer_a_missing_home_only_while_some_node_serves() -> None:
    """The gateway's and the simulator's one candidate rule: holders flagged by the plan's homes; a home that does
    not hold the version joins only while another node serves it (a move), so a version served nowhere gets no
    candidate and is warmed instead."""
    n1, n2 = (Candidate(n, Tier.DISK, 2, 0, 0, 0, 0.0, False, 1) for n in ("n1", "n2"))
    home = Candidate("n3", Tier.COLD, 2, 0, 0, 0, 0.0, False, 1)
    pool = plan_candidates([n1, n2], [home], ["n2", "n3"])
    assert [(c.node, c.in_placement) for c in pool] == [("n1", False), ("n2", True), ("n3", True)]
    assert [c.in_placement for c in plan_candidates([n1, n2], [], [])] == [True, True]  # no plan: every holder
    assert plan_candidates([], [home], ["n3"]) == []
    # A home that holds it wins over a missing home (in-engine first is not at stake here: both on disk or cold).
    decision = route(plan_candidates([n1, n2], [home], ["n2", "n3"]))
    assert decision is not None and decision.node == "n2"
