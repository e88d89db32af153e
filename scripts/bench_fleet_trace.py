"""What ``scripts/bench_fleet --trace-out PATH`` records of one measured replay, for ``scripts/simulate --replay PATH``.

JSON lines, in order:

- ``{"kind": "header", ...}``: the fleet (``nodes``, ``max_loras``, ``max_cpu_loras``, the engines'
  ``max_num_seqs``), the adapters (name → ``lora_int_id``, ``size_bytes``, ``r``), each node's engine at the
  replay's start (``gpu``, ``cpu`` in LRU order, ``disk``: every name it serves, from its engine or its disk), the
  reconciler's plan then (adapter → nodes), the requests its rates count then (``prior_requests``: usage records of
  the last 600 s per adapter), the times of its passes during the replay (``reconciles``, seconds from the start),
  its ``miss_cost`` and ``replica_worth`` (None = the default), the eviction policy, ``concurrency``,
  ``max_tokens``, the Zipf α and seed, and the load average at the end (1 and 5 minutes);
- ``{"kind": "request", "i", "adapter", "sent_s", "done_s", "ok", "id", "node", "tier", "reroutes"}`` per request,
  times in seconds from the replay's start; ``node`` is where the live gateway sent it and ``tier`` the version's
  placement tier there in the fleet view it routed by (database words: ``hot``, ``warm``, ``staged``, ``cold``), both
  from the gateway's route log (``QUIVER_GATEWAY_ROUTE_LOG=INFO``, matched by the answer's ``id``; absent when the
  log has no line for it);
- ``{"kind": "warm", "how", "adapter", "node", "t_s"}`` per control-plane warm the gateway asked for during the
  replay: ``move`` (in the background, to the plan's home, while the request is served where the version is) or
  ``wait`` (no node served it: the request waited for the warm);
- ``{"kind": "plan", "t_s", "plan"}`` each time the reconciler's published plan changed during the replay (adapter
  → nodes);
- ``{"kind": "engines", "loads": {node: {"disk_to_cpu", "cpu_to_gpu", "requests", "load_s", "disk_to_cpu_s",
  "cpu_to_gpu_s"}}, "served": {node: {"resident", "loaded"}}}``: the engines' own counts over the replay
  (``inference.node.worker_ext``: ``moves`` and ``served``, the requests whose adapter the CPU cache held when they
  were first scheduled, or that were read from disk for them).

``engine_loads`` reads the same counters (and the engines' finished requests) around every replay of bench_fleet.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
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


def engine_loads(engines: dict[str, tuple[str, str]]) -> dict[str, dict[str, float]]:
    """Each engine's load counters and finished requests since it started: node -> {"disk_to_cpu", "cpu_to_gpu",
    "requests", "load_s"} (requests include the effect probe's; ``load_s``: seconds the engine spent in both kinds
    of move, inside its steps)."""
    out = {}
    for node, (url, key) in engines.items():
        listing = httpx.get(url + "/quiver/v1/loras", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        listing.raise_for_status()
        loads = (listing.json().get("residency") or {}).get("moves") or {}
        metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        metrics.raise_for_status()
        done = sum(float(line.rpartition(" ")[2]) for line in metrics.text.splitlines()
                   if line.startswith("vllm:request_success_total{"))
        out[node] = {"disk_to_cpu": int(loads.get("disk_to_cpu", 0)), "cpu_to_gpu": int(loads.get("cpu_to_gpu", 0)),
                     "requests": int(done),
                     "load_s": float(loads.get("disk_to_cpu_s", 0.0)) + float(loads.get("cpu_to_gpu_s", 0.0))}
    return out


def adapters_and_plan(names: Sequence[str]) -> tuple[dict[str, dict[str, int]], dict[str, list[str]], dict[str, int]]:
    """``({name: {"lora_int_id", "size_bytes", "r"}}, {name: [node]}, {name: requests})`` for the newest ready
    version of each name, the reconciler's last plan, and the requests its rates count now (usage records of the
    last ``RATE_WINDOW_S``); Django must be set up (``bench_fleet._warm_where_placed`` does)."""
    from datetime import timedelta

    from django.db import connections
    from django.db.models import Count
    from django.utils import timezone

    from adapters_app.models import AdapterVersion
    from inference.fleet.plan import plan_all
    from inference.fleet.reconcile import RATE_WINDOW_S
    from inference.metering.models import UsageRecord

    adapters = {v.adapter.name: {"lora_int_id": v.pk, "size_bytes": v.size_bytes, "r": v.r or 8}
                for v in AdapterVersion.objects.filter(adapter__name__in=names, status="ready")
                .select_related("adapter").order_by("number")}
    by_id = {a["lora_int_id"]: n for n, a in adapters.items()}
    plan = {by_id[v]: list(nodes) for v, nodes in plan_all().items() if v in by_id}
    since = timezone.now() - timedelta(seconds=RATE_WINDOW_S)
    counts = {by_id[v]: n for v, n in UsageRecord.objects.filter(created_at__gte=since, adapter_version__in=by_id)
              .values_list("adapter_version").annotate(n=Count("id")).values_list("adapter_version", "n")}
    connections.close_all()
    return adapters, plan, counts


_FIELD = re.compile(r" (\w+)=(\S+)")


def route_events(log: str, *, start_unix: float, names: Mapping[int, str], nodes: Mapping[int, str]
                 ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Parse the gateway's route log (``inference.gateway.exchange.route_log`` lines) from ``start_unix`` on.

    Args:
        log: the gateway process's log text.
        start_unix: the replay's start, Unix seconds; earlier lines are skipped.
        names: version id → adapter name (lines for other versions are skipped).
        nodes: node primary key → node name (warm lines name the node by key).

    Returns:
        ``({request id: {"node", "tier", "reroutes"}}, [{"kind": "warm", "how", "adapter", "node", "t_s"}])``; the
        request id is vLLM's answer ``id``, ``cmpl-<rid>``.
    """
    routes: dict[str, dict[str, Any]] = {}
    warms: list[dict[str, Any]] = []
    for line in log.splitlines():
        event = next((e for e in ("gateway.route", "gateway.move", "gateway.warm") if f" {e} " in line + " "), None)
        if event is None:
            continue
        fields = dict(_FIELD.findall(line[line.index(event):]))
        try:
            t_s = float(fields["t"]) - start_unix
            version = int(fields["version_id"])
        except (KeyError, ValueError):
            continue
        if t_s < 0 or version not in names:
            continue
        if event == "gateway.route":
            routes[f"cmpl-{fields.get('rid', '')}"] = {"node": fields.get("node", ""), "tier": fields.get("tier", "?"),
                                                       "reroutes": int(fields.get("reroutes", 0))}
        else:
            warms.append({"kind": "warm", "how": "move" if event == "gateway.move" else "wait",
                          "adapter": names[version], "node": nodes.get(int(fields.get("node_pk", -1)), "?"),
                          "t_s": round(t_s, 4)})
    return routes, warms


def write_trace(path: Path, *, header: dict[str, Any], requests: Sequence[dict[str, Any]],
                before: Mapping[str, dict[str, Any]], after: Mapping[str, dict[str, Any]],
                events: Sequence[dict[str, Any]] = ()) -> None:
    """Write one replay as JSON lines (see the module docstring); ``before``/``after`` are ``engine_snapshot``s,
    ``events`` the ``warm`` and ``plan`` lines."""
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
             *sorted(events, key=lambda e: e["t_s"]),
             {"kind": "engines", "loads": loads, "served": served}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _node_names() -> dict[int, str]:
    from django.db import connections

    from inference.fleet.models import Node

    names = dict(Node.objects.values_list("pk", "name"))
    connections.close_all()
    return names


def _watch_plan(by_id: Mapping[int, str], stop: threading.Event, out: list[dict[str, Any]], passes: list[float],
                every_s: float = 0.25) -> None:
    """Until ``stop``, read the reconciler's published plan every ``every_s`` and append ``{"t_s": Unix seconds,
    "plan"}`` when it changed (``t_s`` made relative by the caller), and each reconcile pass's Unix time to
    ``passes``: every pass publishes the plan with a fresh ``PLAN_TTL_S``, so the key's TTL dates the last one."""
    from common.redis import sync_client
    from inference.fleet.plan import PLAN_TTL_S, plan_all, plan_key

    last: dict[str, list[str]] | None = None
    client = sync_client()
    while not stop.wait(every_s):
        try:
            plan = {by_id[v]: sorted(nodes) for v, nodes in plan_all().items() if v in by_id}
            ttl_ms = client.pttl(plan_key()) if client is not None else -1
        except Exception:  # noqa: BLE001 (Redis away for a moment: the next read tells)
            continue
        if plan != last:
            out.append({"kind": "plan", "t_s": time.time(), "plan": plan})
            last = plan
        if isinstance(ttl_ms, int) and ttl_ms > 0:
            at = time.time() - (PLAN_TTL_S * 1000 - ttl_ms) / 1000
            if not passes or at - passes[-1] > 1.0:
                passes.append(at)


def record(out: Path, *, engines: Mapping[str, tuple[str, str]], names: Sequence[str], header: dict[str, Any],
           send: Any, route_log: Path | None = None) -> Any:
    """Run ``send(sent)`` (one replay appending each request to ``sent``, and ``{"start_unix"}`` when it starts)
    between two ``engine_snapshot``s, with the plan watched, and write the recording to ``out``; with
    ``route_log`` (the affinity gateway's log, written with ``QUIVER_GATEWAY_ROUTE_LOG=INFO``), each request's
    live routing decision and the gateway's warms too. Returns what ``send`` returned."""
    sent: list[dict[str, Any]] = []
    before, (adapters, plan, prior) = engine_snapshot(engines), adapters_and_plan(names)
    by_id = {a["lora_int_id"]: n for n, a in adapters.items()}
    plans: list[dict[str, Any]] = []
    passes: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_plan, args=(by_id, stop, plans, passes), daemon=True)
    watcher.start()
    try:
        result = send(sent)
    finally:
        stop.set()
        watcher.join()
    after = engine_snapshot(engines)
    start = next((r["start_unix"] for r in sent if "start_unix" in r), time.time())
    requests = [r for r in sent if "start_unix" not in r]
    events: list[dict[str, Any]] = [{**p, "t_s": round(p["t_s"] - start, 4)} for p in plans]
    if route_log is not None:
        time.sleep(0.5)  # the gateway's last lines reach its log
        routes, warms = route_events(route_log.read_text(errors="replace"), start_unix=start, names=by_id,
                                     nodes=_node_names())
        requests = [{**r, **routes.get(r.get("id", ""), {})} for r in requests]
        events += warms
    write_trace(out, requests=requests, before=before, after=after, events=events,
                header={**header, "adapters": adapters, "plan": plan, "prior_requests": prior,
                        "reconciles": [round(t - start, 3) for t in passes if t > start],
                        "load_avg": os.getloadavg()[:2]})
    return result
