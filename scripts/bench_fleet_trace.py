"""What ``scripts/bench_fleet --trace-out PATH`` records of one measured replay, for ``scripts/simulate --replay PATH``.

JSON lines, in order:

- ``{"kind": "header", ...}``: the fleet (``nodes``, ``max_loras``, ``max_cpu_loras``), the adapters (name →
  ``lora_int_id``, ``size_bytes``, ``r``), each node's engine at the replay's start (``gpu``, ``cpu`` in LRU order,
  ``disk``: every name it serves, from its engine or its disk), the reconciler's plan then (adapter → nodes), the
  eviction policy, ``concurrency``, ``max_tokens``, the Zipf α and seed, and the load average;
- ``{"kind": "request", "i", "adapter", "sent_s", "done_s", "ok"}`` per request, times in seconds from the replay's
  start;
- ``{"kind": "engines", "loads": {node: {"disk_to_cpu", "cpu_to_gpu", "requests", "load_s", "disk_to_cpu_s",
  "cpu_to_gpu_s"}}, "served": {node: {"resident", "loaded"}}}``: the engines' own counts over the replay
  (``inference.node.worker_ext``: ``moves`` and ``served``, the requests whose adapter the CPU cache held when they
  were first scheduled, or that were read from disk for them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx


def engine_snapshot(engines: Mapping[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Each engine's lists now: node -> ``{"gpu": [id], "cpu": [id] (LRU order, oldest first), "disk": [id] (every
    id it serves by name), "served": {"resident", "loaded"}, "moves": {...}}``."""
    out = {}
    for node, (url, key) in engines.items():
        listing = httpx.get(url + "/quiver/v1/loras", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        listing.raise_for_status()
        body = listing.json()
        residency = body.get("residency") or {}
        out[node] = {"gpu": [int(i) for i in residency.get("gpu", [])],
                     "cpu": [int(i) for i in residency.get("lru", residency.get("cpu", []))],
                     "disk": sorted(int(lora["lora_int_id"]) for lora in body.get("loras", [])),
                     "served": dict(residency.get("served") or {}), "moves": dict(residency.get("moves") or {})}
    return out


def adapters_and_plan(names: Sequence[str]) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """``({name: {"lora_int_id", "size_bytes", "r"}}, {name: [node]})`` for the newest ready version of each name
    and the reconciler's last plan; Django must be set up (``bench_fleet._warm_where_placed`` does)."""
    from django.db import connections

    from adapters_app.models import AdapterVersion
    from inference.fleet.plan import plan_all

    adapters = {v.adapter.name: {"lora_int_id": v.pk, "size_bytes": v.size_bytes, "r": v.r or 8}
                for v in AdapterVersion.objects.filter(adapter__name__in=names, status="ready")
                .select_related("adapter").order_by("number")}
    by_id = {a["lora_int_id"]: n for n, a in adapters.items()}
    plan = {by_id[v]: list(nodes) for v, nodes in plan_all().items() if v in by_id}
    connections.close_all()
    return adapters, plan


def write_trace(path: Path, *, header: dict[str, Any], requests: Sequence[dict[str, Any]],
                before: Mapping[str, dict[str, Any]], after: Mapping[str, dict[str, Any]]) -> None:
    """Write one replay as JSON lines (see the module docstring); ``before``/``after`` are ``engine_snapshot``s."""
    loads, served = {}, {}
    for node in after:
        moved = {k: float(after[node]["moves"].get(k, 0)) - float(before[node]["moves"].get(k, 0))
                 for k in ("disk_to_cpu", "cpu_to_gpu", "disk_to_cpu_s", "cpu_to_gpu_s")}
        loads[node] = moved
        served[node] = {k: int(after[node]["served"].get(k, 0)) - int(before[node]["served"].get(k, 0))
                        for k in ("resident", "loaded")}
    state = {node: {k: before[node][k] for k in ("gpu", "cpu", "disk")} for node in before}
    lines = [{"kind": "header", **header, "state": state},
             *({"kind": "request", **r} for r in sorted(requests, key=lambda r: r["sent_s"])),
             {"kind": "engines", "loads": loads, "served": served}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def record(out: Path, *, engines: Mapping[str, tuple[str, str]], names: Sequence[str], header: dict[str, Any],
           send: Any) -> Any:
    """Run ``send(sent)`` (one replay appending each request to ``sent``) between two ``engine_snapshot``s and
    write the recording to ``out``; returns what ``send`` returned."""
    sent: list[dict[str, Any]] = []
    before, (adapters, plan) = engine_snapshot(engines), adapters_and_plan(names)
    result = send(sent)
    import os

    write_trace(out, requests=sent, before=before, after=engine_snapshot(engines),
                header={**header, "adapters": adapters, "plan": plan, "load_avg": os.getloadavg()[:2]})
    return result
