"""Which adapter leaves a node's engine CPU cache: the one node-side rule the agent, the engine's worker extension and
the simulator all call (``node_victims``).

Per tier, what the eviction policy governs (docs/placement.md, "Eviction, tier by tier"):

- **GPU slots** (``max_loras``): vLLM's own batch recency, on purpose. A slot changes hands only inside a step, when
  the batch about to run needs an adapter that holds none (``LRUCacheLoRAModelManager.activate_adapter`` in
  ``vllm/lora/model_manager.py``: it evicts the least recently *activated* slot, the CPU copy stays); the scheduler
  admits at most ``max_loras`` distinct adapters per batch (``vllm/v1/core/sched/scheduler.py``), so every adapter of
  the running batch was just touched and the LRU slot is one the batch does not use. Any other order could only
  keep an adapter the batch does not need, and a GPU miss costs a copy from the CPU cache (``set_lora`` into
  preallocated buffers), not a read.
- **Engine CPU cache** (``max_cpu_loras``): the policy (``QUIVER_EVICTION_POLICY``: ``lru``, ``lfu`` = fewest
  *requests*, decayed; ``cost``), through ``node_victims``, for every load into a full cache — the agent's loads and
  the engine's own in-request reloads. A miss here is a read from disk.
- **Node disk** (the agent's byte budget, ``inference.node.cache``): least recently used, never an adapter the
  engine's CPU cache holds. A miss is an S3 fetch.

Order inside the CPU cache, first to leave first: adapters of a tenant at or over its residency quota (the control
plane says which, in its heartbeat answer), then undesired ones (no served name, or planned on other nodes only and
idle here ``ELSEWHERE_IDLE_S``), then the policy's order. Never chosen: pins, adapters busy on the node (a load or
effect probe in progress, or in the running batch), and, while another can go, fresh ones (loaded within the grace
and their request not run yet).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from inference.policy.eviction import AllPinnedError, EvictionConfig, Resident, choose_victims, disk_reload_ms

# An adapter used this recently (seconds since its last batch) may still have a request decoding.
GRACE_BUSY_S = 1.0
# An adapter the plan puts elsewhere is ranked undesired once idle here this long (seconds; a few requests' time).
ELSEWHERE_IDLE_S = 5.0
# The control plane's hints (plan, quotas) count while at most this many heartbeats old.
HINTS_STALE_HEARTBEATS = 3


@dataclass(frozen=True, slots=True)
class NodeResident:
    """One adapter in a node's engine CPU cache, as the node sees it.

    Attributes:
        version_id: ``lora_int_id``.
        size_bytes: its CPU copy, bytes.
        pinned: pinned in the engine.
        idle_s: seconds since it was last in a batch or loaded (``1e12``: never).
        requests: its request count, decayed to now (LFU's figure).
        served: a name serves it (False: an orphan copy; first to go).
        busy: a load or effect probe of it is in progress, or it is in the running batch: never a victim.
        fresh: loaded within the eviction grace and its request has not run yet (``is_fresh``).
        planned_elsewhere: the control plane's plan puts it on other nodes only.
        tenant_over_quota: its tenant is at or over its residency quota (the control plane's hint).
    """

    version_id: int
    size_bytes: int = 0
    pinned: bool = False
    idle_s: float = 1e12
    requests: float = 0.0
    served: bool = True
    busy: bool = False
    fresh: bool = False
    planned_elsewhere: bool = False
    tenant_over_quota: bool = False


def is_fresh(*, loaded_ago_s: float, requests_since_load: float, idle_s: float, grace_s: float) -> bool:
    """Whether a load is still in its eviction grace: made less than ``grace_s`` ago and either no request has run
    on it since (``requests_since_load`` ≤ 0) or it was in a batch within ``GRACE_BUSY_S`` (its request may still be
    decoding). A time-only grace kept each new cold adapter and evicted a hot one instead (bench_fleet, 16 adapters
    over 8 slots)."""
    return loaded_ago_s < grace_s and (requests_since_load <= 0 or idle_s < GRACE_BUSY_S)


def hints_current(*, age_s: float, heartbeat_s: float) -> bool:
    """Whether the control plane's last hints (``age_s`` old) still count: at most ``HINTS_STALE_HEARTBEATS``
    heartbeats of ``heartbeat_s`` seconds."""
    return age_s <= HINTS_STALE_HEARTBEATS * heartbeat_s


def _resident(r: NodeResident, now_s: float) -> Resident:
    desired = r.served and not (r.planned_elsewhere and r.idle_s >= ELSEWHERE_IDLE_S)
    return Resident(version_id=r.version_id, tenant_id=0, size_bytes=r.size_bytes, pinned=r.pinned,
                    last_used_s=now_s - r.idle_s, hits=r.requests, hits_at_s=now_s,
                    reload_ms=disk_reload_ms(r.size_bytes), desired=desired, tenant_over_quota=r.tenant_over_quota)


def node_victims(residents: Sequence[NodeResident], *, capacity: int, now_s: float,
                 config: EvictionConfig) -> tuple[int, ...]:
    """The adapters to drop from a node's engine CPU cache so that one more fits.

    Args:
        residents: the cache's content (the incoming adapter not among them).
        capacity: ``max_cpu_loras``.
        now_s: the caller's clock, seconds (only differences with ``idle_s`` matter).
        config: the node's policy.

    Returns:
        ``lora_int_id``s in eviction order; empty when it already fits, or when every resident is busy (the engine's
        own LRU then decides, as vLLM would).

    Raises:
        AllPinnedError: only pins (and busy adapters) are left.
    """
    if len(residents) < capacity:
        return ()
    idle = [r for r in residents if not r.busy]
    slots = capacity - (len(residents) - len(idle))
    if slots < 1:
        return ()
    candidates = [_resident(r, now_s) for r in idle]
    fresh = {r.version_id for r in idle if r.fresh and not r.pinned}
    if fresh and slots - len(fresh) >= 1:
        # Older residents go first; if only pins are left among them, the fresh ones are fair game again.
        with contextlib.suppress(AllPinnedError):
            victims = choose_victims([c for c in candidates if c.version_id not in fresh], slots=slots - len(fresh),
                                     budget_bytes=None, incoming_bytes=0, now_s=now_s, config=config)
            if victims:
                return victims
    return choose_victims(candidates, slots=slots, budget_bytes=None, incoming_bytes=0, now_s=now_s, config=config)
