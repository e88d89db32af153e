"""Node gauges over time: a bounded history written from heartbeats, read by the console's fleet page.

Why a table and not Prometheus: the console must work without a Prometheus server (issue 8, "time series come from
Quiver's own tables"). Bounded two ways: at most one row per node per ``QUIVER_NODE_SAMPLE_INTERVAL_S`` (heartbeats
come every few seconds), and rows older than ``QUIVER_NODE_SAMPLE_RETENTION_S`` are deleted when the node's next
sample is written, so no beat task is needed and a node that stops reporting keeps only its last day.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from inference.fleet.models import Node, NodeSample

MAX_POINTS = 2000


def slots_used(state: Mapping[str, Any]) -> tuple[int, int]:
    """``(gpu_used, cpu_used)`` from a heartbeat: the engine's own residency summary when present, else the reported
    adapters' tiers. ``cpu_used`` counts GPU residents too (vLLM keeps a CPU copy of each; ``max_cpu_loras`` counts
    them)."""
    summary = state.get("residency")
    if isinstance(summary, Mapping) and isinstance(summary.get("gpu"), int) and isinstance(summary.get("cpu"), int):
        return summary["gpu"], summary["gpu"] + summary["cpu"]
    tiers = [a.get("tier") for a in state.get("adapters", []) if isinstance(a, Mapping)]
    hot = tiers.count("hot")
    return hot, hot + tiers.count("warm")


def node_sample_record(*, node: Node, state: Mapping[str, Any], now: datetime | None = None) -> NodeSample | None:
    """Store one sample of ``node``'s validated heartbeat unless its last one is younger than the interval; prune
    that node's samples past the retention. Returns the new sample, or None when skipped."""
    now = now or timezone.now()
    last = NodeSample.objects.filter(node=node).order_by("-t").values_list("t", flat=True).first()
    return node_sample_after(node=node, state=state, now=now, last=last)


def node_sample_after(*, node: Node, state: Mapping[str, Any], now: datetime, last: datetime | None
                      ) -> NodeSample | None:
    """``node_sample_record`` for a caller that read the node's last sample time ``last`` (None: no sample yet)
    with the node's row, as a heartbeat does: no query unless a sample is due."""
    if last is not None and now - last < timedelta(seconds=settings.QUIVER_NODE_SAMPLE_INTERVAL_S):
        return None
    gpu, cpu = slots_used(state)
    sample = NodeSample.objects.create(
        node=node, t=now, healthy=bool(state.get("healthy")), kv_cache_usage_perc=state.get("kv_cache_usage_perc"),
        num_requests_running=state.get("num_requests_running"), num_requests_waiting=state.get("num_requests_waiting"),
        num_preemptions_total=state.get("num_preemptions_total"), gpu_used=gpu, cpu_used=cpu)
    NodeSample.objects.filter(node=node, t__lt=now - timedelta(seconds=settings.QUIVER_NODE_SAMPLE_RETENTION_S)).delete()
    return sample


def node_samples(node: Node, *, since: datetime, until: datetime | None = None) -> list[dict[str, Any]]:
    """The node's samples in ``[since, until)``, oldest first, thinned to at most 2,000 points (every k-th).

    Returns:
        ``[{"t": ISO 8601, "healthy", "kv_cache_usage_perc" (0..1 or null), "num_requests_running",
        "num_requests_waiting", "num_preemptions_total", "preemptions" (increase since the previous point, null
        at the first or after a counter reset), "gpu_used", "cpu_used"}]``.
    """
    rows = NodeSample.objects.filter(node=node, t__gte=since)
    if until is not None:
        rows = rows.filter(t__lt=until)
    points = list(rows.order_by("t").values("t", "healthy", "kv_cache_usage_perc", "num_requests_running",
                                            "num_requests_waiting", "num_preemptions_total", "gpu_used", "cpu_used"))
    step = -(-len(points) // MAX_POINTS)  # ceil: thin first, so deltas span the points kept
    if step > 1:
        points = points[::step]
    out: list[dict[str, Any]] = []
    previous: float | None = None
    for p in points:
        total = p["num_preemptions_total"]
        delta = total - previous if total is not None and previous is not None and total >= previous else None
        previous = total
        out.append({**p, "t": p["t"].isoformat(), "preemptions": delta})
    return out
