from __future__ import annotations

import pytest

from inference.policy.engine_model import LoRAEngineModel
from inference.policy.eviction import (
    AllPinnedError,
    EvictionConfig,
    EvictionPolicy,
    PinLimitError,
    Resident,
    check_pin,
    choose_victims,
    decayed_hits,
    gpu_slot_bytes,
)
from inference.policy.tiers import Tier, tier_from_word

LRU, LFU, COST = (EvictionConfig(policy=p, half_life_s=100.0) for p in EvictionPolicy)


def res(v: int, **kw: object) -> Resident:
    kw.setdefault("tenant_id", 1)
    kw.setdefault("size_bytes", 10)
    return Resident(version_id=v, **kw)  # type: ignore[arg-type]


def test_fits_means_no_victim() -> None:
    assert choose_victims([res(1)], slots=2, budget_bytes=None, incoming_bytes=10, now_s=0, config=LRU) == ()


def test_lru_lfu_cost_orders() -> None:
    a = res(1, last_used_s=10, hits=1, hits_at_s=10, reload_ms=500)   # recent, rare, expensive
    b = res(2, last_used_s=1, hits=50, hits_at_s=1, reload_ms=5)      # old, frequent, cheap
    kw = {"slots": 2, "budget_bytes": None, "incoming_bytes": 10, "now_s": 11}
    assert choose_victims([a, b], config=LRU, **kw) == (2,)  # type: ignore[arg-type]
    assert choose_victims([a, b], config=LFU, **kw) == (1,)  # type: ignore[arg-type]
    assert choose_victims([a, b], config=COST, **kw) == (2,)  # type: ignore[arg-type]  # 50×5 < 1×500


def test_decay_lets_yesterdays_favourite_go() -> None:
    assert decayed_hits(64, 0, 600, 100.0) == pytest.approx(1.0)
    old = res(1, hits=64, hits_at_s=0, last_used_s=0)
    new = res(2, hits=4, hits_at_s=900, last_used_s=900)
    assert choose_victims([old, new], slots=2, budget_bytes=None, incoming_bytes=1, now_s=1000, config=LFU) == (1,)


def test_byte_budget_may_need_several_victims() -> None:
    residents = [res(1, size_bytes=40, last_used_s=1), res(2, size_bytes=40, last_used_s=2), res(3, size_bytes=10)]
    victims = choose_victims(residents, slots=10, budget_bytes=100, incoming_bytes=60, now_s=5, config=LRU)
    assert victims == (3, 1)


def test_over_quota_tenant_loses_its_own_first_then_undesired() -> None:
    mine = res(1, tenant_id=7, tenant_over_quota=True, hits=100, hits_at_s=5, last_used_s=5)
    theirs = res(2, tenant_id=8, hits=0, last_used_s=0)
    stray = res(3, tenant_id=8, desired=False, hits=100, hits_at_s=5, last_used_s=5)
    kw = {"slots": 3, "budget_bytes": None, "incoming_bytes": 1, "now_s": 5, "config": LFU}
    assert choose_victims([theirs, mine, stray], **kw) == (1,)  # type: ignore[arg-type]
    assert choose_victims([theirs, stray], slots=2, budget_bytes=None, incoming_bytes=1, now_s=5,
                          config=LFU) == (3,)


def test_pins_honoured_and_all_pinned_raises() -> None:
    residents = [res(1, pinned=True), res(2, last_used_s=9)]
    assert choose_victims(residents, slots=2, budget_bytes=None, incoming_bytes=1, now_s=10, config=LRU) == (2,)
    with pytest.raises(AllPinnedError):
        choose_victims([res(1, pinned=True)], slots=1, budget_bytes=None, incoming_bytes=1, now_s=0, config=LRU)


def test_pin_bound_is_slots_minus_one() -> None:
    check_pin(6, 8)
    with pytest.raises(PinLimitError, match="at most 7"):
        check_pin(7, 8)


def test_gpu_slot_is_rank_padded() -> None:
    assert gpu_slot_bytes(1000, 8, 64) == 8000
    with pytest.raises(ValueError, match="max_lora_rank"):
        gpu_slot_bytes(1000, 128, 64)


def test_engine_model_evicts_cpu_and_gpu_together() -> None:
    engine = LoRAEngineModel(max_loras=2, max_cpu_loras=3)
    for i in (1, 2, 3):
        engine.activate(i)
    assert engine.tier(1) is Tier.CPU and engine.tier(3) is Tier.GPU  # 1 lost its slot, kept its CPU copy
    evicted, demoted = engine.activate(4)  # CPU full: LRU entry 1 leaves the engine
    assert evicted == [1] and engine.tier(1) is Tier.COLD
    assert demoted == 2
    engine.activate(3)
    evicted, _ = engine.activate(5)  # CPU LRU is now 2; evicting it from CPU
    assert evicted == [2] and 2 not in engine.gpu


def test_engine_model_all_pinned_raises_like_vllm() -> None:
    engine = LoRAEngineModel(max_loras=1, max_cpu_loras=2)
    engine.pin_lora(1)
    engine.activate(1)
    engine.activate(2)  # a pin holds the CPU copy only: the GPU slot stays LRU (worker_ext)
    assert engine.tier(1) is Tier.CPU and engine.tier(2) is Tier.GPU
    engine = LoRAEngineModel(max_loras=2, max_cpu_loras=2)
    engine.pin_lora(1)
    engine.pin_lora(2)
    with pytest.raises(AllPinnedError):
        engine.add_lora(3)  # the CPU cache is all pins


def test_tier_words() -> None:
    assert tier_from_word("hot") is Tier.GPU and tier_from_word("cpu") is Tier.CPU
    with pytest.raises(ValueError, match="staged"):
        tier_from_word("lukewarm")
