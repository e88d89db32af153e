"""Validation of a node agent's heartbeat body (its ``GET /v1/state`` JSON) before anything is recorded.

Pure: no ORM or clock. A heartbeat either parses completely or is refused with the first bad field named; nothing
of a refused heartbeat is stored. Identity and URLs are not taken from the body (they are fixed at registration, see
``inference.fleet.nodes``); a body that claims others is refused by the caller.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from inference.policy.node_report import ReportedAdapter

# Same rule as the node's disk cache (inference.node.cache.LORA_NAME_RE): nothing that escapes a folder.
LORA_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
MAX_ADAPTERS = 10_000
# Engine figures that are counts (integers >= 0) and the fraction in [0, 1] (vllm:kv_cache_usage_perc).
# (num_preemptions_total is a Prometheus counter, a float: the generic non-negative rule covers it.)
COUNTS = ("max_loras", "max_cpu_loras", "max_lora_rank", "num_requests_running", "num_requests_waiting")
FRACTIONS = ("kv_cache_usage_perc",)
# Counts land in PostgreSQL integer columns: anything past int4 would fail the write (a 500) instead of a 400.
MAX_COUNT = 2**31 - 1
MAX_ID = 2**63 - 1  # a bigint primary key; past it the database query raised OverflowError (a 500)
# Echoed by the agent and compared with the registry (inference.fleet.nodes): strings or absent.
STRINGS = ("agent_url", "engine_url", "base_model")
# The agent's ``residency`` summary (inference.node.state_report.residency_summary): counts and bytes are integers, read as
# such by the control plane (``fleet_reconcile._hot_bytes``, ``directory._gpu_used``); ``move_seconds`` a number.
RESIDENCY_INTEGERS = ("gpu", "cpu", "disk", "errored", "pinned", "gpu_bytes", "cpu_bytes", "disk_bytes",
                      "gpu_slot_bytes", "loads_total")


class HeartbeatInvalid(ValueError):
    """The heartbeat body is malformed; ``field`` names the first bad field (e.g. ``adapters[3].tier``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(field: str, value: Any, *, integer: bool) -> None:
    if value is None:
        return
    ok = _is_int(value) if integer else (_is_int(value) or isinstance(value, float))
    if not ok or (isinstance(value, float) and not math.isfinite(value)) or value < 0:
        kind = "an integer" if integer else "a number"
        raise HeartbeatInvalid(field, f"must be {kind} >= 0 or null, got {value!r:.40}")


def _finite_everywhere(state: Mapping[str, Any]) -> None:
    """Refuse NaN and infinities at any depth: ``json.loads`` accepts them, PostgreSQL's jsonb does not (the stored
    copy of the body failed to write: a 500). Iterative, so a body nested as deep as the parser allows is walked;
    the path is spelled out only for the value refused."""
    stack: list[tuple[tuple[Any, ...] | None, Any]] = [(None, state)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            parts: list[str] = []
            while path is not None:
                path, key = path
                parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
            raise HeartbeatInvalid("".join(reversed(parts)).lstrip(".")[:200], f"must be a finite number, got {value!r}")
        if isinstance(value, Mapping):
            stack.extend(((path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((path, i), v) for i, v in enumerate(value))


def _residency(summary: Any) -> None:
    if summary is None:
        return
    if not isinstance(summary, Mapping):
        raise HeartbeatInvalid("residency", f"must be an object or null, got {type(summary).__name__}")
    for field in RESIDENCY_INTEGERS:
        value = summary.get(field)
        _non_negative(f"residency.{field}", value, integer=True)
        if value is not None and value > MAX_ID:
            raise HeartbeatInvalid(f"residency.{field}", f"must be at most {MAX_ID}, got {value!r:.40}")
    for field, value in summary.items():  # move_seconds and figures added later: numbers >= 0
        if field not in RESIDENCY_INTEGERS and isinstance(value, (int, float)) and not isinstance(value, bool):
            _non_negative(f"residency.{field}", value, integer=False)


def heartbeat_parse(state: Any, *, tiers: Collection[str]) -> tuple[dict[str, Any], list[ReportedAdapter]]:
    """Check a heartbeat body and return it with its adapters.

    Args:
        state: the decoded JSON body.
        tiers: the residency tiers a node may report (``Placement.Tier`` values).

    Returns:
        ``(state, adapters)``: the body as a dict, and each adapter entry parsed.

    Raises:
        HeartbeatInvalid: not an object; ``node`` not a string; ``agent_url``, ``engine_url`` or ``base_model``
            present but not a string; ``healthy`` not a boolean; a count that is not an integer in [0, 2**31 - 1]; ``kv_cache_usage_perc`` outside [0, 1]; any other top-level number negative or not finite;
            NaN or an infinity at any depth; ``residency`` not an object, a count or byte figure of it not an
            integer in [0, 2**63 - 1], or another number of it negative;
            ``adapters`` not a list, longer than 10,000, or an entry with a bad ``lora_name``, ``lora_int_id`` < 1,
            an unknown ``tier``, non-boolean ``pinned``/``served``, or a duplicate ``lora_int_id``.
    """
    if not isinstance(state, Mapping):
        raise HeartbeatInvalid("body", "must be the agent's state JSON object")
    _finite_everywhere(state)
    if not isinstance(state.get("node"), str):
        raise HeartbeatInvalid("node", "must be the node's name")
    if not isinstance(state.get("healthy", False), bool):
        raise HeartbeatInvalid("healthy", "must be true or false")
    for field in STRINGS:
        if state.get(field) is not None and not isinstance(state[field], str):
            raise HeartbeatInvalid(field, f"must be a string or null, got {type(state[field]).__name__}")
    for field in COUNTS:
        _non_negative(field, state.get(field), integer=True)
        if (state.get(field) or 0) > MAX_COUNT:
            raise HeartbeatInvalid(field, f"must be at most {MAX_COUNT}, got {state[field]!r}")
    for field in FRACTIONS:
        value = state.get(field)
        _non_negative(field, value, integer=False)
        if value is not None and value > 1:
            raise HeartbeatInvalid(field, f"is a fraction in [0, 1], got {value!r}")
    for field, value in state.items():  # figures added later (residency bytes...) follow the same rule
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _non_negative(field, value, integer=False)
    _residency(state.get("residency"))
    raw = state.get("adapters", [])
    if not isinstance(raw, list):
        raise HeartbeatInvalid("adapters", "must be a list")
    if len(raw) > MAX_ADAPTERS:
        raise HeartbeatInvalid("adapters", f"lists {len(raw)} entries; at most {MAX_ADAPTERS}")
    adapters: list[ReportedAdapter] = []
    seen: set[int] = set()
    for i, entry in enumerate(raw):
        where = f"adapters[{i}]"
        if not isinstance(entry, Mapping):
            raise HeartbeatInvalid(where, "must be an object")
        name, lora_int_id, tier = entry.get("lora_name"), entry.get("lora_int_id", 0), entry.get("tier")
        if not isinstance(name, str) or not LORA_NAME_RE.match(name):
            raise HeartbeatInvalid(f"{where}.lora_name", f"is not a served name: {name!r}")
        if not isinstance(lora_int_id, int) or isinstance(lora_int_id, bool) or not 1 <= lora_int_id <= MAX_ID:
            raise HeartbeatInvalid(f"{where}.lora_int_id", f"must be an integer in [1, {MAX_ID}] (an adapter "
                                   f"version's id), got {lora_int_id!r:.40}")
        if lora_int_id in seen:
            raise HeartbeatInvalid(f"{where}.lora_int_id", f"{lora_int_id} is listed twice")
        seen.add(lora_int_id)
        if tier not in tiers:
            raise HeartbeatInvalid(f"{where}.tier", f"must be one of {sorted(tiers)}, got {tier!r}")
        for flag in ("pinned", "served"):
            if not isinstance(entry.get(flag, False), bool):
                raise HeartbeatInvalid(f"{where}.{flag}", "must be true or false")
        for field, value in entry.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                _non_negative(f"{where}.{field}", value, integer=False)
        served = entry.get("served")
        adapters.append(ReportedAdapter(name, int(lora_int_id), str(tier), bool(entry.get("pinned", False)),
                                        served if isinstance(served, bool) else None))
    return dict(state), adapters
