"""Which residents leave a tier of one node to make room, under byte and slot budgets.

Budgets are per tier per node, in bytes and in slots:

- a GPU slot costs the *rank-padded* size: vLLM preallocates every slot's ``lora_a``/``lora_b`` buffers at
  ``max_lora_rank`` (``vllm/lora/layers``, ``create_lora_weights``), so an r8 adapter on an engine started with
  ``--max-lora-rank 64`` takes 8× its own size there (``gpu_slot_bytes``);
- the CPU cache holds each adapter at its own size (``LoRAModel.from_local_checkpoint`` keeps the checkpoint's
  tensors), up to ``max_cpu_loras`` entries.

Policies (one setting, ``QUIVER_EVICTION_POLICY``, picks one):

- ``lru``: least recently used first — what vLLM's own ``LRUCache`` does (``vllm/utils/cache.py``);
- ``lfu``: fewest requests first, counts halving every ``half_life_s`` (LFU with exponential decay, so yesterday's
  hit does not squat forever; as in "LRFU", Lee et al., IEEE ToC 2001);
- ``cost``: lowest reload cost × request rate first (GreedyDual-Size's idea, Cao & Irani 1997; Chameleon's
  cost-aware eviction, arXiv 2411.17741).

Before the policy's order: residents of a tenant over its residency quota go first (it loses its own adapters
before anyone else does), then residents the placement no longer wants on this node. Pins are never chosen; when
only pins are left the call raises ``AllPinnedError``, as vLLM's LRU raises ``RuntimeError("All items are
pinned…")`` (``vllm/utils/cache.py``). Pins per node are bounded at ``slots − 1`` so unpinned traffic always has a
slot (SGLang's rule; vLLM pins never expire, ``vllm#5603``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class EvictionPolicy(StrEnum):
    """Eviction policy names, as set in ``QUIVER_EVICTION_POLICY``."""

    LRU = "lru"
    LFU = "lfu"
    COST = "cost"


class AllPinnedError(RuntimeError):
    """Room cannot be made without evicting a pinned adapter (vLLM raises the same in ``remove_oldest``)."""


class PinLimitError(ValueError):
    """A pin would leave no unpinned slot on the node (at most ``slots − 1`` pins)."""


class Resident(NamedTuple):
    """One version resident in a tier of a node (immutable; a NamedTuple since one is built per resident per
    decision).

    Attributes:
        version_id: ``lora_int_id``.
        tenant_id: owning tenant.
        size_bytes: what it costs in this tier (``gpu_slot_bytes`` for the GPU tier, its own size for CPU/disk).
        pinned: pinned by an operator (never evicted).
        last_used_s: time of its last request, seconds on the caller's clock.
        hits: its request count, decayed as of ``hits_at_s`` (see ``decayed_hits``).
        hits_at_s: when ``hits`` was last updated, seconds on the caller's clock.
        reload_ms: what bringing it back would cost, ms (from the tier below; the cost model's figure).
        desired: the placement wants it on this node.
        tenant_over_quota: its tenant holds more than its residency quota.
    """

    version_id: int
    tenant_id: int
    size_bytes: int
    pinned: bool = False
    last_used_s: float = 0.0
    hits: float = 0.0
    hits_at_s: float = 0.0
    reload_ms: float = 1.0
    desired: bool = True
    tenant_over_quota: bool = False


@dataclass(frozen=True, slots=True)
class EvictionConfig:
    """Eviction knobs.

    Attributes:
        policy: which order to evict in.
        half_life_s: seconds for a request count to halve (``lfu`` and ``cost``).
    """

    policy: EvictionPolicy = EvictionPolicy.LFU
    half_life_s: float = 600.0


def decayed_hits(hits: float, at_s: float, now_s: float, half_life_s: float) -> float:
    """``hits`` counted at ``at_s``, decayed to ``now_s``: ``hits × 2^(−(now_s − at_s) / half_life_s)``."""
    if now_s <= at_s:
        return hits
    return hits * math.pow(2.0, -(now_s - at_s) / half_life_s)


# Reload cost from disk for the cost-aware policy: the engine's fixed add_lora cost measured on the CPU node
# (22 ms, docs/placement.md) plus the bytes at 1 GB/s (devtools/simulate/costs.py's disk figure).
RELOAD_FIXED_MS = 22.0
DISK_BYTES_PER_MS = 1e6


def disk_reload_ms(size_bytes: int) -> float:
    """What reading an adapter of ``size_bytes`` from a node's disk into the engine costs, ms
    (``RELOAD_FIXED_MS`` + the bytes at ``DISK_BYTES_PER_MS``)."""
    return RELOAD_FIXED_MS + size_bytes / DISK_BYTES_PER_MS


def gpu_slot_bytes(size_bytes: int, r: int, max_lora_rank: int) -> int:
    """Bytes a version takes in one GPU slot: its size padded from rank ``r`` to ``max_lora_rank``.

    Raises:
        ValueError: ``r`` is not in ``1..max_lora_rank`` (the engine would reject it).
    """
    if not 1 <= r <= max_lora_rank:
        raise ValueError(f"r={r} must be between 1 and max_lora_rank={max_lora_rank}")
    return math.ceil(size_bytes * max_lora_rank / r)


def pin_allowed(pinned: int, slots: int) -> bool:
    """True while one more pin leaves at least one unpinned slot (``pinned + 1 ≤ slots − 1``)."""
    return pinned + 1 <= slots - 1


def check_pin(pinned: int, slots: int) -> None:
    """Raise if one more pin on a tier with ``slots`` slots and ``pinned`` pins is not allowed.

    Raises:
        PinLimitError: with the limit in the message.
    """
    if not pin_allowed(pinned, slots):
        raise PinLimitError(f"at most {max(slots - 1, 0)} pinned adapters per node on {slots} slots; "
                            "unpin one first")


def _order_key(now_s: float, config: EvictionConfig) -> Callable[[Resident], tuple[bool, bool, float, float, int]]:
    """The sort key: over-quota tenants first, then undesired, then the policy's order (smallest leaves first)."""
    half_life = config.half_life_s
    if config.policy is EvictionPolicy.LRU:
        return lambda r: (not r.tenant_over_quota, r.desired, r.last_used_s, 0.0, r.version_id)
    if config.policy is EvictionPolicy.LFU:
        # decayed_hits inlined: this runs for every resident on every miss (the simulator's hot loop).
        return lambda r: (not r.tenant_over_quota, r.desired,
                          r.hits * 2.0 ** (min(0.0, r.hits_at_s - now_s) / half_life), r.last_used_s, r.version_id)
    return lambda r: (not r.tenant_over_quota, r.desired,
                      r.hits * 2.0 ** (min(0.0, r.hits_at_s - now_s) / half_life) * r.reload_ms, r.last_used_s,
                      r.version_id)


def eviction_order(residents: Sequence[Resident], *, now_s: float,
                   config: EvictionConfig = EvictionConfig()) -> list[Resident]:
    """Unpinned residents, first to leave first: over-quota tenants, then undesired, then by policy."""
    return sorted((r for r in residents if not r.pinned), key=_order_key(now_s, config))


def choose_victims(residents: Sequence[Resident], *, slots: int, budget_bytes: int | None, incoming_bytes: int,
                   now_s: float, config: EvictionConfig = EvictionConfig()) -> tuple[int, ...]:
    """The versions to evict so one more version of ``incoming_bytes`` fits.

    Args:
        residents: what the tier holds now (the incoming version not among them).
        slots: the tier's slot count (``max_loras`` or ``max_cpu_loras``).
        budget_bytes: the tier's byte budget, or None for slots only.
        incoming_bytes: the newcomer's size in this tier.
        now_s: the caller's clock, seconds.
        config: policy.

    Returns:
        ``version_id``s to evict, in order; empty when it already fits.

    Raises:
        AllPinnedError: it cannot fit without evicting a pinned version (or is larger than the whole budget).
    """
    if budget_bytes is not None and incoming_bytes > budget_bytes:
        raise AllPinnedError(f"{incoming_bytes} bytes exceed the tier's whole budget of {budget_bytes}")
    count = len(residents)
    used = sum(r.size_bytes for r in residents)

    def fits() -> bool:
        return count + 1 <= slots and (budget_bytes is None or used + incoming_bytes <= budget_bytes)

    victims: list[int] = []
    if fits():
        return ()
    order: Iterable[Resident]
    if budget_bytes is None and count + 1 - slots == 1:
        # The common case (one slot short, no byte budget): one min() instead of a sort.
        unpinned = [r for r in residents if not r.pinned]
        order = [min(unpinned, key=_order_key(now_s, config))] if unpinned else []
    else:
        order = eviction_order(residents, now_s=now_s, config=config)
    for r in order:
        victims.append(r.version_id)
        count -= 1
        used -= r.size_bytes
        if fits():
            return tuple(victims)
    raise AllPinnedError("All items are pinned: unpin an adapter or raise the tier's budget")
