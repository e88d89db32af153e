"""A node's capacity as the control plane uses it: what its heartbeat reports, clamped to the operator's ceilings.

A node reports its engine's ``max_loras`` (LoRA slots: adapters one batch holds), ``max_cpu_loras`` (entries of the
engine's CPU LoRA cache) and ``max_lora_rank``; placement, pre-warms, pins and routing size what they hand a node by
them. A host holding a stolen node credential reported 100,000 CPU slots on an idle engine and was sent warms (with
presigned URLs) for every tenant's adapters within seconds (attack round), so every figure used is
``min(reported, ceiling)``. The ceiling is the operator's (``quiver_node_register --max-loras/--max-cpu-loras/
--max-lora-rank``), else the fleet's (``QUIVER_NODE_MAX_LORAS_CEILING``, ``QUIVER_NODE_MAX_CPU_LORAS_CEILING``; for
the rank, the base model's pool ``max_lora_rank``, which the validator already holds adapters to).

Pure: no ORM, settings or clock; ``inference.fleet.nodes`` resolves the ceilings and stores the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CAPACITY_FIELDS = ("max_loras", "max_cpu_loras", "max_lora_rank")
MAX_CEILING = 2**31 - 1  # the columns are PostgreSQL integers


@dataclass(frozen=True)
class Clamp:
    """One figure a node reported above its ceiling: ``field`` (one of ``CAPACITY_FIELDS``), both counts."""

    field: str
    reported: int
    ceiling: int


@dataclass(frozen=True)
class NodeCapacity:
    """The figures the control plane uses (each ``min(reported, ceiling)``, 0 when not reported) and the clamps."""

    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    clamped: tuple[Clamp, ...] = ()


def ceilings_resolve(own: Mapping[str, int | None], fleet: Mapping[str, int | None]) -> dict[str, int | None]:
    """Per field of ``CAPACITY_FIELDS``: the node's own ceiling (operator-set) where set, else the fleet's; None =
    no ceiling (only where neither is set)."""
    return {f: own.get(f) if own.get(f) is not None else fleet.get(f) for f in CAPACITY_FIELDS}


def capacity_effective(reported: Mapping[str, Any], ceilings: Mapping[str, int | None]) -> NodeCapacity:
    """The capacity to use for a node.

    Args:
        reported: the heartbeat's figures by field name (validated by ``inference.fleet.heartbeat``: integers in
            [0, 2**31 - 1], or absent/None = 0).
        ceilings: field → ceiling (an integer >= 0), or None for none (``ceilings_resolve``).

    Returns:
        The clamped figures, with a ``Clamp`` for each reported above its ceiling.
    """
    out: dict[str, int] = {}
    clamped: list[Clamp] = []
    for field in CAPACITY_FIELDS:
        value = int(reported.get(field) or 0)
        ceiling = ceilings.get(field)
        if ceiling is not None and value > ceiling:
            clamped.append(Clamp(field, value, ceiling))
            value = ceiling
        out[field] = value
    return NodeCapacity(**out, clamped=tuple(clamped))


def ceilings_check(ceilings: Mapping[str, int | None]) -> None:
    """Check operator-set ceilings (None = the fleet's default) before they are stored.

    Args:
        ceilings: field → ceiling as resolved for the node (the node's own or the fleet's).

    Raises:
        ValueError: ``(field, message)`` as its args: a ceiling not an integer in [1, 2**31 - 1], or
            ``max_cpu_loras`` below ``max_loras`` (vLLM's ``LoRAConfig`` refuses an engine so configured).
    """
    for field in CAPACITY_FIELDS:
        value = ceilings.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CEILING:
            raise ValueError(field, f"must be an integer in [1, {MAX_CEILING}], got {value!r}")
    gpu, cpu = ceilings.get("max_loras"), ceilings.get("max_cpu_loras")
    if gpu is not None and cpu is not None and cpu < gpu:
        raise ValueError("max_cpu_loras", f"ceiling {cpu} is below the max_loras ceiling {gpu}; vLLM needs "
                         "max_cpu_loras >= max_loras, so raise max_cpu_loras or lower max_loras")
