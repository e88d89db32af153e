"""The emulated engine's scheduler and cost model, stepped by hand (no clock)."""

from __future__ import annotations

import asyncio

import pytest

from devtools.hollow.costs import CPU_TINY, H100_8B, EngineCosts, calibration
from devtools.hollow.engine import HollowEngine, ServedLora
from inference.policy.tiers import Tier

COSTS = EngineCosts(name="t", decode_a_ms=5, decode_b_ms=1, decode_c_ms=2, prefill_ms_per_token=0.5,
                    load_fixed_ms=20, disk_bytes_per_ms=1000, swap_fixed_ms=3, pcie_bytes_per_ms=1e6,
                    bytes_per_rank=1000, slot_rank=1, kv_blocks=100, block_size=4, max_num_seqs=8)


def _engine(max_loras: int = 1, max_cpu_loras: int = 2, costs: EngineCosts = COSTS) -> HollowEngine:
    engine = HollowEngine("base", costs, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    engine._ensure_running = lambda: None  # type: ignore[method-assign]  # stepped by hand
    return engine


def _serve(engine: HollowEngine, name: str, lora_id: int, size: int = 10_000) -> None:
    engine.served[name] = ServedLora(name, lora_id, f"/x/{name}", size)
    engine.sizes[lora_id] = size


def test_step_time_is_the_cost_model() -> None:
    async def run() -> None:
        engine = _engine(max_loras=2)
        for _ in range(3):
            engine.submit(8, 4, None)
        # a + b·3 + prefill 24 tokens × 0.5
        assert engine.step() == pytest.approx(5 + 3 + 12)
        assert engine.step() == pytest.approx(5 + 3)  # decode only
        _serve(engine, "a", 1)
        engine.submit(4, 1, 1)
        # one more sequence and one adapter: disk → CPU 20 + 10,000 B at 1000 B/ms, CPU → GPU 3 + 1000 B / 1e6
        assert engine.step() == pytest.approx(5 + 4 + 2 + 2 + 20 + 10 + 3 + 0.001)
        assert engine.moves["disk_to_cpu"] == 1 and engine.moves["cpu_to_gpu"] == 1
        assert engine.loras.tier(1) is Tier.GPU

    asyncio.run(run())


def test_max_loras_defers_other_adapters() -> None:
    async def run() -> None:
        engine = _engine(max_loras=1, max_cpu_loras=4)
        _serve(engine, "a", 1)
        _serve(engine, "b", 2)
        first, second, third = engine.submit(4, 2, 1), engine.submit(4, 2, 2), engine.submit(4, 2, 1)
        engine.step()
        assert set(engine.running) == {first, third}
        assert list(engine.waiting) == [second] and engine.deferred == 1
        assert engine.lora_names(engine.waiting) == ["b"]
        engine.step()  # both of "a" finish
        assert first.done and third.done
        engine.step()
        assert engine.running == [second]

    asyncio.run(run())


def test_gpu_slot_lru_and_cpu_eviction_follow_vllm() -> None:
    async def run() -> None:
        engine = _engine(max_loras=1, max_cpu_loras=2)
        for i, name in enumerate("abc", start=1):
            _serve(engine, name, i)
        engine.add_lora(engine.served["a"])
        engine.add_lora(engine.served["b"])
        assert list(engine.loras.gpu) == [2] and list(engine.loras.cpu) == [1, 2]  # a demoted, kept in CPU
        engine.add_lora(engine.served["c"])  # CPU full: LRU "a" leaves both tiers
        assert engine.loras.tier(1) is Tier.COLD and sum(engine.loads.values()) == 3
        engine.submit(4, 1, 1)  # a request reloads it from disk
        engine.step()
        assert engine.loads[1] == 2 and engine.arrival_tiers == {"cold": 1}

    asyncio.run(run())


def test_kv_pressure_preempts_the_newest() -> None:
    async def run() -> None:
        costs = calibration("cpu-tiny", kv_blocks=3, block_size=4, max_num_seqs=8)
        engine = _engine(max_loras=1, costs=costs)
        first, second = engine.submit(3, 8, None), engine.submit(3, 8, None)
        engine.step()
        assert engine.running == [first, second] and engine.free_blocks == 1
        for _ in range(3):
            engine.step()
        assert engine.preemptions >= 1 and second in engine.waiting and not second.prefilled
        assert 0 <= engine.kv_usage() <= 1

    asyncio.run(run())


def test_calibrations_charge_8b_adapter_sizes() -> None:
    assert H100_8B.adapter_bytes(16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj"]) == 80 * (1 << 20)
    assert H100_8B.adapter_bytes(16, "all-linear") == 80 * (1 << 20)
    # The simulator's cost model charges the same moves.
    sim = H100_8B.to_sim()
    assert sim.disk_to_cpu_ms(80 << 20) == pytest.approx(H100_8B.disk_to_cpu_ms(80 << 20))
    assert sim.cpu_to_gpu_ms() == pytest.approx(H100_8B.cpu_to_gpu_ms())
    # CPU calibration: a step of 8 alone ≈ 18 ms, one adapter ≈ 31 ms (bench_fleet, docs/placement.md stop 29).
    assert CPU_TINY.step_ms(8, 0, 0) == pytest.approx(18, abs=0.5)
    assert CPU_TINY.step_ms(8, 1, 0) == pytest.approx(31, abs=0.5)


def test_the_first_request_after_a_warm_counts_as_warmed_not_resident() -> None:
    async def run() -> None:
        engine = _engine(max_loras=1, max_cpu_loras=2)
        _serve(engine, "a", 1)
        engine.add_lora(engine.served["a"])  # the control plane's warm for the request below
        engine.submit(4, 1, 1)
        engine.submit(4, 1, 1)
        assert engine.arrival_tiers == {"warmed": 1, "gpu": 1}
        assert engine.load_sources == {"add_lora": 1}

    asyncio.run(run())


def test_a_reload_into_a_full_cpu_cache_evicts_by_the_worker_extensions_rule() -> None:
    """Production's worker extension (``worker_ext.policy_victim``: LFU by default) picks the victim of the engine's
    own reloads, not vLLM's LRU: the adapter with more requests stays though it was used less recently."""
    async def run() -> None:
        engine = _engine(max_loras=1, max_cpu_loras=2)
        engine.grace_s = 0.0
        for i, name in enumerate("abc", start=1):
            _serve(engine, name, i)
        for _ in range(3):
            engine.submit(4, 1, 1)
        engine.step()
        engine.submit(4, 1, 2)
        engine.step()  # "b" now the most recent, "a" the most requested
        assert list(engine.loras.cpu) == [1, 2]
        engine.submit(4, 1, 3)
        engine.step()
        assert engine.loras.tier(1) is not Tier.COLD and engine.loras.tier(2) is Tier.COLD
        assert [what for _, i, what in engine.events if what.startswith("drop")] == ["drop:policy"]
        engine.eviction_policy = "lru"
        engine.submit(4, 1, 2)
        engine.step()  # LRU: "a" (used before "c") leaves
        assert engine.loras.tier(1) is Tier.COLD

    asyncio.run(run())


def test_the_agents_effect_probe_is_not_counted_as_a_request() -> None:
    """The probe after a load is the agent's own request: it neither counts as a client's arrival nor takes the
    "warmed" mark from the request the load was for (the scale run compares client requests with the simulator)."""
    async def run() -> None:
        engine = _engine(max_loras=1, max_cpu_loras=2)
        _serve(engine, "a", 1)
        engine.add_lora(engine.served["a"])
        engine.submit(4, 4, 1, probe=True)
        engine.submit(4, 1, 1)
        assert engine.arrival_tiers == {"warmed": 1} and engine.probes == 1 and engine.requests[1] == 1

    asyncio.run(run())
