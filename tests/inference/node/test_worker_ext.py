"""The worker extension's eviction: Quiver's policy picks the victim when a load finds vLLM's CPU cache full.

Runs on vLLM's own cache class (``vllm.lora.model_manager.AdapterLRUCache``) and its own
``LRUCacheLoRAModelManager.remove_oldest_adapter`` as ``inference.node.worker_ext`` patches it; the engine-level
check is ``tests/inference/node/test_engine_ext.py::test_a_reload_in_a_request_evicts_by_the_nodes_policy``.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from vllm.lora.model_manager import AdapterLRUCache, LRUCacheLoRAModelManager

from inference.node import worker_ext
from inference.policy.eviction import EvictionConfig, EvictionPolicy


@pytest.fixture(autouse=True)
def _fresh_counters(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = (dict(worker_ext.HITS), dict(worker_ext.LAST_USED), set(worker_ext.IN_USE))
    worker_ext.HITS.clear()
    worker_ext.LAST_USED.clear()
    worker_ext.IN_USE.clear()
    monkeypatch.setattr(worker_ext, "REQUESTS", Counter())
    monkeypatch.setattr(worker_ext, "LOADED", {})
    monkeypatch.setattr(worker_ext, "_SEEN", OrderedDict())
    monkeypatch.setattr(worker_ext, "HINTS", (-1.0, frozenset(), frozenset()))
    yield
    worker_ext.HITS.clear()
    worker_ext.HITS.update(saved[0])
    worker_ext.LAST_USED.clear()
    worker_ext.LAST_USED.update(saved[1])
    worker_ext.IN_USE.clear()
    worker_ext.IN_USE.update(saved[2])


def _cache(ids: list[int], removed: list[int]) -> AdapterLRUCache[object]:
    """vLLM's CPU cache holding ``ids`` (first = LRU-oldest); ``removed`` collects what it deactivates."""
    cache: AdapterLRUCache[object] = AdapterLRUCache(len(ids), removed.append)
    for i in ids:
        cache.put(i, SimpleNamespace(loras={}))
    return cache


def _use(lora_id: int, times: int, at: float) -> None:
    """``times`` new requests for ``lora_id`` at ``at``, each in one batch."""
    for _ in range(times):
        worker_ext.note_requests([(f"req-{next(_REQ)}", lora_id)], at)
    worker_ext.LAST_USED[lora_id] = at


_REQ = itertools.count()


def test_lfu_drops_the_least_used_adapter_where_vllms_lru_drops_the_oldest() -> None:
    now = time.monotonic()
    _use(1, 50, now - 10)  # the hot one, oldest in LRU order
    for i in (2, 3, 4):
        _use(i, 1, now - 1)
    removed: list[int] = []
    manager = SimpleNamespace(_registered_adapters=_cache([1, 2, 3, 4], removed))

    assert LRUCacheLoRAModelManager.remove_oldest_adapter(manager) is True  # the patched method, as vLLM calls it

    assert removed == [2]  # fewest requests; among equals the LRU-oldest. vLLM's LRU would have dropped 1
    assert sorted(manager._registered_adapters.cache) == [1, 3, 4]


def test_the_running_batch_and_pins_are_never_victims() -> None:
    now = time.monotonic()
    for i, uses in ((1, 9), (2, 1), (3, 1), (4, 5)):
        _use(i, uses, now)
    removed: list[int] = []
    cache = _cache([1, 2, 3, 4], removed)
    cache.pin(2)

    victim = worker_ext.policy_victim(cache, in_use={3}, now=now)

    assert victim == 4  # 2 is pinned, 3 is running: 4 has fewer requests than 1
    assert worker_ext.policy_victim(cache, in_use={1, 3, 4}, now=now) is None  # only a pin left: vLLM decides


def test_lfu_counts_requests_not_the_steps_they_ran() -> None:
    """A request that decodes for 100 steps counts once: one long answer does not outweigh five short requests
    (``LoRAModelRunnerMixin.set_active_loras`` sees it in every batch until it finishes)."""
    now = time.monotonic()
    for _ in range(100):
        worker_ext.note_requests([("long", 1)], now)  # one request, 100 steps
    for k in range(5):
        worker_ext.note_requests([(f"short-{k}", 2), ("long", 1), (f"base-{k}", 0)], now)
    worker_ext.LAST_USED.update({1: now, 2: now})

    assert worker_ext.REQUESTS[1] == 1 and worker_ext.REQUESTS[2] == 5 and 0 not in worker_ext.REQUESTS
    assert worker_ext.policy_victim(_cache([2, 1], []), in_use=set(), now=now) == 1


def test_the_control_planes_hints_rank_an_over_quota_tenants_adapter_first_until_they_expire() -> None:
    """The engine's own reloads rank as the agent does (``node_eviction.node_victims``): the adapter of a tenant
    over its residency quota goes first even when it is the most used, while the hints hold."""
    now = time.monotonic()
    _use(1, 50, now)  # tenant A's, hot, over quota
    _use(2, 1, now - 1)  # tenant B's, cold
    cache = _cache([1, 2], [])
    ext = worker_ext.QuiverWorkerExtension()

    assert ext.quiver_set_eviction_hints([1], [], 30.0) == {"over_quota": 1, "elsewhere": 0}
    assert worker_ext.policy_victim(cache, in_use=set(), now=now) == 1
    assert worker_ext.policy_victim(cache, in_use=set(), now=now + 31) == 2  # stale hints: policy alone


def test_a_fresh_load_whose_request_has_not_run_is_spared_while_another_can_go() -> None:
    now = time.monotonic()
    _use(1, 3, now - 2)
    worker_ext.LAST_USED[2] = now - 2
    worker_ext.LOADED[2] = (now - 2, 0)  # loaded 2 s ago, no request yet: within the 5 s grace
    cache = _cache([1, 2], [])

    assert worker_ext.policy_victim(cache, in_use=set(), now=now) == 1
    assert worker_ext.policy_victim(cache, in_use=set(), now=now + 10) == 2  # grace over: fewest requests


def test_lru_policy_follows_the_last_batch_not_the_caches_insertion_order() -> None:
    now = time.monotonic()
    _use(1, 1, now - 1)
    _use(2, 1, now - 5)
    _use(3, 1, now - 3)
    cache = _cache([1, 2, 3], [])

    lru = EvictionConfig(policy=EvictionPolicy.LRU)
    assert worker_ext.policy_victim(cache, in_use=set(), now=now, config=lru) == 2


def test_counts_decay_so_traffic_that_moved_away_stops_holding_a_slot() -> None:
    now = time.monotonic()
    _use(1, 40, now - 3600)  # busy an hour ago: 40 steps halve six times (600 s half-life) to under 1
    _use(2, 2, now - 1)
    cache = _cache([1, 2], [])

    assert worker_ext.policy_victim(cache, in_use=set(), now=now) == 1


def test_when_every_unpinned_adapter_is_in_use_vllms_lru_decides() -> None:
    removed: list[int] = []
    cache = _cache([1, 2], removed)
    cache.pin(1)
    worker_ext.IN_USE.update({2})
    before = worker_ext.EVICTIONS["lru"]

    assert LRUCacheLoRAModelManager.remove_oldest_adapter(SimpleNamespace(_registered_adapters=cache)) is True

    assert removed == [2] and worker_ext.EVICTIONS["lru"] == before + 1


def test_moves_are_counted_and_timed_only_when_something_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """``count_loads`` counts disk→CPU reads and CPU→GPU copies and sums the seconds each took inside the step (an
    activation of an adapter already in a slot moves nothing and costs no time). The clock is the test's: each
    fake move advances it by its own seconds, so the sums are exact however busy the machine is."""
    clock = [100.0]
    monkeypatch.setattr(worker_ext, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def slow_load(request: object) -> str:
        clock[0] += 0.02
        return "model"

    def activate(lora_id: int) -> bool:
        clock[0] += 0.01 if lora_id != 7 else 0.3
        return lora_id != 7  # 7 is already in a slot: vLLM returns False

    worker = SimpleNamespace(_load_adapter=slow_load, _adapter_manager=SimpleNamespace(activate_adapter=activate))
    counts = worker_ext.count_loads(worker)
    assert worker_ext.count_loads(worker) is counts  # installed once
    assert worker._load_adapter(object()) == "model"
    assert worker._adapter_manager.activate_adapter(3) is True
    assert worker._adapter_manager.activate_adapter(7) is False
    assert counts["disk_to_cpu"] == 1 and counts["cpu_to_gpu"] == 1
    assert counts["disk_to_cpu_s"] == pytest.approx(0.02)
    assert counts["cpu_to_gpu_s"] == pytest.approx(0.01)  # only the activation that moved something


def test_each_request_is_counted_resident_or_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's own served-resident share (``SERVED``): a request counts where its adapter was when it was
    first scheduled, whatever later steps see."""
    monkeypatch.setattr(worker_ext, "SERVED", Counter())
    held = {1}
    now = time.monotonic()
    worker_ext.note_requests([("a", 1), ("b", 2), ("c", 0)], now, resident=held.__contains__)
    held.add(2)  # b's batch loaded it
    worker_ext.note_requests([("a", 1), ("b", 2), ("d", 2)], now, resident=held.__contains__)

    assert worker_ext.SERVED == Counter({"resident": 2, "loaded": 1})
