"""A vLLM worker extension that reports the engine's true LoRA residency (GPU slots vs CPU cache).

Mounted with ``--worker-extension-cls inference.node.worker_ext.QuiverWorkerExtension`` (vLLM mixes the class into
its worker: ``vllm/v1/worker/worker_base.py``), so the API-server process can ask every worker through the engine's
own RPC: ``await engine_client.collective_rpc("quiver_lora_residency")``. The lists are the LoRA manager's own
(``vllm/lora/model_manager.py``, ``LRUCacheLoRAModelManager``): ``_active_adapters`` = the ``max_loras`` GPU slots,
``_registered_adapters`` = the ``max_cpu_loras`` CPU cache, ``pinned_items`` of the latter = pins
(docs/placement.md, "True residency"). Engine metrics only show adapters with requests in flight (vllm#45325), so
this is the one source that tells an idle GPU-resident adapter from one that was dropped to disk.

It also makes the node's eviction policy (``QUIVER_EVICTION_POLICY``, ``inference.policy.eviction``) choose the
victim of every load that finds the CPU cache full, the engine's own in-request reloads included
(``_evict_by_policy``).
"""

from __future__ import annotations

import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from inference.node.config import eviction_grace_from_env, eviction_policy_from_env
from inference.policy.eviction import AllPinnedError, EvictionConfig, EvictionPolicy, decayed_hits
from inference.policy.node_eviction import NodeResident, is_fresh, node_victims

# Per process (the worker): engine loads (disk -> CPU copy, ``WorkerLoRAManager._load_adapter``) per lora_int_id,
# and per id the scheduler steps that used it and the monotonic time of the last one (``_apply_adapters``, called
# for every batch); per id the requests that used it (``REQUESTS``: each request counted once, when it first appears
# in a batch, ``LoRAModelRunnerMixin.set_active_loras``). The eviction policy reads them (recency, frequency); tests
# count loads.
LOADS: Counter[int] = Counter()
STEPS: Counter[int] = Counter()
REQUESTS: Counter[int] = Counter()
LAST_USED: dict[int, float] = {}
# Per id: (requests decayed to the time beside them, that time): LFU's counts. Kept after an adapter leaves the cache,
# so a reload does not start from zero (nor from its all-time count); past HITS_KEPT records the longest-unseen go.
HITS: dict[int, tuple[float, float]] = {}
HITS_KEPT = 65536
# Request ids already counted (bounded; a request stays in the batch over many steps).
_SEEN: OrderedDict[str, None] = OrderedDict()
_SEEN_KEPT = 65536
# Per id: (monotonic time of its last load, its REQUESTS then): the eviction grace (``node_eviction.is_fresh``).
LOADED: dict[int, tuple[float, int]] = {}
# The ids of the batch being applied, then of the last batch applied: never victims of an eviction (their requests
# are running; vLLM's LRU spares them the same way, having just touched them).
IN_USE: set[int] = set()
# Requests for an adapter, by whether the CPU cache held it when the request was first scheduled (``note_requests``).
SERVED: Counter[str] = Counter()
# Evictions made by Quiver's policy here, and those left to vLLM's LRU (every unpinned resident in use).
EVICTIONS: Counter[str] = Counter()
EVICTION = EvictionConfig(policy=EvictionPolicy(eviction_policy_from_env(os.environ)))
GRACE_S = eviction_grace_from_env(os.environ)
# The control plane's hints, relayed by the agent (``quiver_set_eviction_hints``): (valid until, monotonic; ids of
# tenants at or over quota; ids planned on other nodes only).
HINTS: tuple[float, frozenset[int], frozenset[int]] = (-1.0, frozenset(), frozenset())


def _count_engine_activity() -> bool:
    """Wrap vLLM's ``WorkerLoRAManager._load_adapter``, ``LRUCacheWorkerLoRAManager._apply_adapters`` and
    ``LoRAModelRunnerMixin.set_active_loras`` (class level, once per process) to fill :data:`LOADS`,
    :data:`STEPS`, :data:`REQUESTS` and :data:`LAST_USED`. False without vLLM."""
    try:
        from vllm.lora import worker_manager
    except ImportError:
        return False
    base, lru = worker_manager.WorkerLoRAManager, worker_manager.LRUCacheWorkerLoRAManager
    if getattr(base._load_adapter, "_quiver_counted", False):
        return True
    load, apply = base._load_adapter, lru._apply_adapters

    def counted_load(self: Any, lora_request: Any) -> Any:
        model = load(self, lora_request)
        lora_id = int(lora_request.lora_int_id)
        LOADS[lora_id] += 1
        # A fresh load counts as a use for recency, as vLLM's own LRU puts an added adapter at its recent end;
        # otherwise an adapter loaded but not yet batched (no effect probe on a reload) would look the oldest.
        LAST_USED[lora_id] = time.monotonic()
        LOADED[lora_id] = (LAST_USED[lora_id], REQUESTS[lora_id])
        return model

    def counted_apply(self: Any, lora_requests: Any) -> None:
        ids = {int(request.lora_int_id) for request in lora_requests if request}
        IN_USE.clear()
        IN_USE.update(ids)
        apply(self, lora_requests)
        now = time.monotonic()
        for i in ids:
            STEPS[i] += 1
            LAST_USED[i] = now

    counted_load._quiver_counted = True  # type: ignore[attr-defined]
    base._load_adapter = counted_load  # type: ignore[method-assign]
    lru._apply_adapters = counted_apply  # type: ignore[method-assign]
    try:
        from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
    except ImportError:
        return True
    set_active = LoRAModelRunnerMixin.set_active_loras

    def counted_set_active(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        n = int(input_batch.num_reqs)
        manager = getattr(getattr(self, "lora_manager", None), "_adapter_manager", None)
        registered = getattr(manager, "_registered_adapters", None)
        note_requests(zip(input_batch.req_ids[:n], input_batch.request_lora_mapping[:n].tolist(), strict=False),
                      time.monotonic(), resident=None if registered is None else registered.__contains__)
        return set_active(self, input_batch, *args, **kwargs)

    LoRAModelRunnerMixin.set_active_loras = counted_set_active  # type: ignore[method-assign]
    return True


def note_requests(batch: Iterable[tuple[str, int]], now: float, half_life_s: float | None = None, *,
                  resident: Callable[[int], bool] | None = None) -> None:
    """Count each request of a batch once, for its adapter: ``batch`` pairs a request id with its ``lora_int_id``
    (0: the base model). A new request adds one to :data:`REQUESTS` and to the decayed count in :data:`HITS` (LFU
    with decay, as the agent and the simulator count: ``inference.policy.eviction.decayed_hits``, halving every
    ``half_life_s``, default the policy's 600 s). With ``resident`` (whether the CPU cache holds an id before this
    batch's adapters are applied), :data:`SERVED` counts it ``resident`` or ``loaded`` (its batch reads it from
    disk first): the engine's own served-resident share, which ``scripts/simulate --replay`` is checked against."""
    half_life = EVICTION.half_life_s if half_life_s is None else half_life_s
    for req_id, lora_id in batch:
        if lora_id <= 0 or req_id in _SEEN:
            continue
        _SEEN[req_id] = None
        if resident is not None:
            SERVED["resident" if resident(lora_id) else "loaded"] += 1
        if len(_SEEN) > _SEEN_KEPT:
            _SEEN.popitem(last=False)
        REQUESTS[lora_id] += 1
        value, at = HITS.get(lora_id, (0.0, now))
        HITS[lora_id] = (decayed_hits(value, at, now, half_life) + 1.0, now)
    if len(HITS) > HITS_KEPT:
        for i in sorted(HITS, key=lambda k: HITS[k][1])[: len(HITS) - HITS_KEPT]:
            del HITS[i]


def policy_victim(registered: Any, *, in_use: set[int], now: float, config: EvictionConfig | None = None) -> int | None:
    """The adapter Quiver's policy drops from a full CPU cache, or None to leave the choice to vLLM's LRU.

    Args:
        registered: the manager's ``_registered_adapters`` (vLLM's ``LoRALRUCache``: ``.cache`` in LRU order,
            oldest first; ``.pinned_items``).
        in_use: ids never chosen (the running batch's).
        now: ``time.monotonic()``.
        config: the policy; default :data:`EVICTION` (``QUIVER_EVICTION_POLICY`` of the engine's environment, or
            what the agent set since: ``QuiverWorkerExtension.quiver_set_eviction_policy``).

    Returns:
        A ``lora_int_id`` from ``registered``, chosen by ``inference.policy.node_eviction.node_victims`` (the
        agent's rule: quota and plan hints from :data:`HINTS`, the grace of a fresh load, then recency
        :data:`LAST_USED`, decayed requests :data:`HITS`, reload cost; ties go to the LRU-oldest), or None when
        every resident is pinned or in use.
    """
    until, over_quota, elsewhere = HINTS
    if now > until:
        over_quota = elsewhere = frozenset()
    residents = []
    for i in registered.cache:
        lora_id = int(i)
        hits, hits_at = HITS.get(lora_id, (0.0, now))
        loaded_at, requests_then = LOADED.get(lora_id, (-1e18, 0))
        idle = now - LAST_USED.get(lora_id, -1e12)
        residents.append(NodeResident(
            version_id=lora_id, size_bytes=_adapter_bytes(registered.cache[i]), pinned=i in registered.pinned_items,
            idle_s=idle, requests=decayed_hits(hits, hits_at, now, (config or EVICTION).half_life_s),
            busy=lora_id in in_use,
            fresh=is_fresh(loaded_ago_s=now - loaded_at, requests_since_load=REQUESTS[lora_id] - requests_then,
                           idle_s=idle, grace_s=GRACE_S),
            planned_elsewhere=lora_id in elsewhere, tenant_over_quota=lora_id in over_quota))
    try:
        victims = node_victims(residents, capacity=len(residents), now_s=now, config=config or EVICTION)
    except AllPinnedError:
        return None
    return victims[0] if victims else None


def _current_hints(now: float) -> dict[str, list[int]]:
    """The control plane's hints this worker ranks by now (:data:`HINTS`; empty once expired)."""
    until, over_quota, elsewhere = HINTS
    if now > until:
        return {"over_quota": [], "elsewhere": []}
    return {"over_quota": sorted(over_quota), "elsewhere": sorted(elsewhere)}


def _lru_manager_class() -> Any:
    """vLLM's ``LRUCacheLoRAModelManager`` (``vllm/lora/model_manager.py``), or None without vLLM."""
    try:
        from vllm.lora import model_manager
    except ImportError:
        return None
    return model_manager.LRUCacheLoRAModelManager


def _evict_by_policy() -> bool:
    """Make vLLM's ``LRUCacheLoRAModelManager.remove_oldest_adapter`` (called when a load finds the CPU cache full,
    ``LRUCacheWorkerLoRAManager.add_adapter``) drop :func:`policy_victim`'s choice (class level, once per process).

    Every load goes through it, also the ones the agent does not start: an evicted adapter keeps its name served
    and its next request reloads it inside the engine (``engine_ext.evict_lora``), where vLLM's LRU alone would pick
    the victim and drop a hot adapter for one request of a cold one. False without vLLM."""
    lru = _lru_manager_class()
    if lru is None:
        return False
    if getattr(lru.remove_oldest_adapter, "_quiver_policy", False):
        return True
    remove_oldest = lru.remove_oldest_adapter

    def remove_by_policy(self: Any) -> bool:
        registered = self._registered_adapters
        victim = policy_victim(registered, in_use=IN_USE, now=time.monotonic())
        if victim is None:
            EVICTIONS["lru"] += 1
            return bool(remove_oldest(self))  # vLLM's LRU (raises when every adapter is pinned)
        registered.pop(victim)  # LoRALRUCache._on_remove frees its GPU slot too, as remove_oldest does
        EVICTIONS[EVICTION.policy.value] += 1
        return True

    remove_by_policy._quiver_policy = True  # type: ignore[attr-defined]
    lru.remove_oldest_adapter = remove_by_policy  # type: ignore[method-assign]
    return True


def _pin_in_cpu_cache_only() -> bool:
    """Make vLLM's ``LRUCacheLoRAModelManager.pin_adapter`` pin the CPU copy only (class level, once per process).

    vLLM pins into both caches (``_pin_lora_in_cpu_cache`` and ``_pin_lora_in_gpu_cache``), but its scheduler still
    admits up to ``max_loras`` distinct adapters per batch. With a GPU slot pinned, a batch of ``max_loras`` unpinned
    adapters has one slot too few: activating the second evicts the first, and the batch mapping then names an id no
    slot holds (``KeyError`` in ``punica_wrapper/utils.py::convert_mapping``), which kills the engine. Seen on the CPU
    node with ``max_loras`` 2, one pin and two adapters in flight (tests/e2e/test_fleet_live.py). A CPU-only pin keeps
    the guarantee Quiver sells (a pinned adapter is never reloaded from disk or S3); moving it into a GPU slot when a
    batch needs it is a copy (``activate_adapter`` in ``vllm/lora/model_manager.py``: ``set_lora`` into the slot's
    preallocated buffers). False without vLLM."""
    lru = _lru_manager_class()
    if lru is None:
        return False
    if getattr(lru.pin_adapter, "_quiver_cpu_only", False):
        return True

    def pin_adapter(self: Any, lora_id: int) -> bool:
        self._pin_lora_in_cpu_cache(lora_id)
        return True

    pin_adapter._quiver_cpu_only = True  # type: ignore[attr-defined]
    lru.pin_adapter = pin_adapter  # type: ignore[method-assign]
    return True


def _tensor_bytes(tensor: Any) -> int:
    if tensor is None:
        return 0
    if isinstance(tensor, list | tuple):
        return sum(_tensor_bytes(t) for t in tensor)
    return int(tensor.numel()) * int(tensor.element_size())


def _adapter_bytes(lora_model: Any) -> int:
    """Bytes of one registered adapter's CPU copy (``LoRAModel.loras``: ``lora_a``/``lora_b`` per module)."""
    return sum(_tensor_bytes(w.lora_a) + _tensor_bytes(w.lora_b) for w in getattr(lora_model, "loras", {}).values())


def _slot_bytes(manager: Any) -> int:
    """Bytes of one GPU slot: every wrapped module's ``lora_a_stacked``/``lora_b_stacked`` buffers, which vLLM
    preallocates at ``max_lora_rank`` for ``max_loras`` slots, divided by the slot count (so it is rank-padded)."""
    total = 0
    for module in getattr(manager, "modules", {}).values():
        total += _tensor_bytes(getattr(module, "lora_a_stacked", None))
        total += _tensor_bytes(getattr(module, "lora_b_stacked", None))
    slots = int(getattr(manager, "lora_slots", 0) or 0)
    return total // slots if slots else 0


def count_loads(worker_lora_manager: Any) -> dict[str, float]:
    """Count and time the engine's own adapter moves from now on (idempotent; installed at the first residency read).

    Wraps, on this worker's manager instances, ``LRUCacheWorkerLoRAManager._load_adapter`` (an adapter read from
    disk into the CPU cache) and ``LRUCacheLoRAModelManager.activate_adapter`` when it returns True (an adapter
    copied into a GPU slot; vLLM returns False when it was already active), both in ``vllm/lora/``. Both run inside
    the engine's step, so their seconds are time every running request of the node waited.

    Returns:
        The live counters ``{"disk_to_cpu": n, "cpu_to_gpu": n, "disk_to_cpu_s": s, "cpu_to_gpu_s": s}`` since they
        were installed (seconds of wall time; an activation that moved nothing is not timed).
    """
    counts: dict[str, float] | None = getattr(worker_lora_manager, "_quiver_loads", None)
    if counts is not None:
        return counts
    counts = {"disk_to_cpu": 0, "cpu_to_gpu": 0, "disk_to_cpu_s": 0.0, "cpu_to_gpu_s": 0.0}
    load, manager = worker_lora_manager._load_adapter, worker_lora_manager._adapter_manager
    activate = manager.activate_adapter

    def counted_load(*args: Any, **kwargs: Any) -> Any:
        counts["disk_to_cpu"] += 1
        started = time.perf_counter()
        try:
            return load(*args, **kwargs)
        finally:
            counts["disk_to_cpu_s"] += time.perf_counter() - started

    def counted_activate(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        moved = activate(*args, **kwargs)
        if moved:
            counts["cpu_to_gpu"] += 1
            counts["cpu_to_gpu_s"] += time.perf_counter() - started
        return moved

    worker_lora_manager._load_adapter = counted_load
    manager.activate_adapter = counted_activate
    worker_lora_manager._quiver_loads = counts
    return counts


def lora_residency(worker_lora_manager: Any) -> dict[str, Any]:
    """Read one worker's LoRA manager.

    Args:
        worker_lora_manager: the worker's ``LRUCacheWorkerLoRAManager`` (``model_runner.lora_manager``).

    Returns:
        ``{"gpu": [lora_int_id], "cpu": [lora_int_id], "pinned": [lora_int_id], "max_loras": int,
        "max_cpu_loras": int, "slot_bytes": int, "bytes": {lora_int_id: int}, "moves": {"disk_to_cpu": n,
        "cpu_to_gpu": n, "disk_to_cpu_s": s, "cpu_to_gpu_s": s}, ...}``: ``gpu`` in slot order (``None``
        slots skipped), ``cpu`` every registered id (GPU residents included, as in vLLM), sorted; ``bytes`` per
        registered adapter's CPU copy. Also ``loads`` (engine loads per id since the worker started, and
        ``loads_total``), ``steps`` (scheduler steps that used each registered id), ``requests`` (requests that used it), ``served`` (requests whose adapter the CPU cache held when
        first scheduled, ``resident``, or read from disk for them, ``loaded``) and ``idle_s`` (seconds since
        each registered id was last in a batch or loaded), the order being the engine's own LRU
        order (``lru``, oldest first); ``moves`` the engine's disk→CPU reads and CPU→GPU copies since the first
        read (``count_loads``); ``eviction`` the engine's policy, its evictions (``{"lfu": n, "lru": n}``:
        by the policy, or left to vLLM's LRU when every unpinned resident was in use) and the control plane's
        hints it ranks by now (``{"over_quota": [id], "elsewhere": [id]}``).
    """
    manager = worker_lora_manager._adapter_manager
    registered = manager._registered_adapters
    now = time.monotonic()
    gpu = [i for i in manager.lora_index_to_id if i is not None and i in manager._active_adapters]
    return {
        "gpu": gpu,
        "cpu": sorted(int(i) for i in registered),
        "pinned": sorted(int(i) for i in getattr(registered, "pinned_items", ())),
        "max_loras": int(manager.lora_slots),
        "max_cpu_loras": int(manager.capacity),
        "slot_bytes": _slot_bytes(manager),
        # ``.cache`` reads without touching the LRU order (``registered[i]`` would refresh it).
        "bytes": {int(i): _adapter_bytes(registered.cache[i]) for i in registered},
        "lru": [int(i) for i in registered.cache],
        "loads": {int(i): n for i, n in LOADS.items()},
        "loads_total": sum(LOADS.values()),
        "steps": {int(i): STEPS.get(int(i), 0) for i in registered},
        "requests": {int(i): REQUESTS.get(int(i), 0) for i in registered},
        "served": {"resident": SERVED["resident"], "loaded": SERVED["loaded"]},
        "idle_s": {int(i): round(now - LAST_USED[int(i)], 3) for i in registered if int(i) in LAST_USED},
        "moves": dict(count_loads(worker_lora_manager)),
        "eviction": {"policy": EVICTION.policy.value, "evictions": dict(EVICTIONS), "hints": _current_hints(now)},
    }


class QuiverWorkerExtension:
    """Mixed into vLLM's worker; its methods are reachable through ``collective_rpc`` by name."""

    def quiver_set_eviction_policy(self, policy: str) -> dict[str, str]:
        """Set this worker's eviction policy (``lru`` | ``lfu`` | ``cost``); the counts it ranks by are kept.

        Raises:
            ValueError: an unknown policy name.
        """
        global EVICTION
        EVICTION = EvictionConfig(policy=EvictionPolicy(policy), half_life_s=EVICTION.half_life_s)
        return {"policy": EVICTION.policy.value}

    def quiver_set_eviction_hints(self, over_quota: list[int], elsewhere: list[int], valid_s: float
                                  ) -> dict[str, int]:
        """Take the control plane's hints for this worker's victims (:data:`HINTS`) for ``valid_s`` seconds:
        adapters of tenants at or over their residency quota (they go first), adapters planned elsewhere only."""
        global HINTS
        HINTS = (time.monotonic() + valid_s, frozenset(int(i) for i in over_quota),
                 frozenset(int(i) for i in elsewhere))
        return {"over_quota": len(HINTS[1]), "elsewhere": len(HINTS[2])}

    def quiver_lora_residency(self) -> dict[str, Any]:
        """This worker's residency (see ``lora_residency``); ``{"enabled": False}`` when LoRA is off."""
        runner = getattr(self, "model_runner", None)
        manager = getattr(runner, "lora_manager", None)
        if manager is None:
            return {"enabled": False}
        return {"enabled": True, **lora_residency(manager)}


_count_engine_activity()  # imported in the worker when vLLM resolves --worker-extension-cls, before any load
_pin_in_cpu_cache_only()
_evict_by_policy()
