"""Prometheus gauges of this node's adapter residency and published engine load, for the agent's ``/metrics``.

Aggregates only (counts and bytes per tier, capacity): no adapter names, so the series count stays fixed however
many adapters a node holds (vllm#11117 on label growth) and nothing tenant-identifying leaves the node. Tiers are
the engine's own (``inference.node.worker_ext``): ``gpu`` = ``max_loras`` slots, ``cpu`` = CPU cache only, ``disk`` =
staged, ``errored`` = last load failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TIERS = ("gpu", "cpu", "disk", "errored")


def render(state: Mapping[str, Any], *, load: Any = None) -> bytes:
    """Prometheus text for one state report (``NodeAgent.state``) and the load publisher's last figures.

    Series: ``quiver_node_lora_adapters{tier}`` (adapters), ``quiver_node_lora_bytes{tier}`` (bytes; ``gpu`` is
    rank-padded slot bytes), ``quiver_node_lora_pinned`` (adapters), ``quiver_node_lora_slots{tier}`` (capacity:
    ``max_loras`` / ``max_cpu_loras``), ``quiver_node_residency_from_engine`` (1 when the engine's own lists were
    read, 0 when inferred from request activity), ``quiver_node_lora_loads`` (engine loads, disk → CPU copy, since
    the engine started; a gauge because an engine restart resets it), ``quiver_node_lora_move_seconds`` (seconds of
    engine steps spent in those loads and in CPU → GPU copies: what residency can save on the node). With ``load`` (an ``inference.node.load_publisher.LoadPublisher``):
    ``quiver_node_kv_cache_usage_perc`` (0..1), ``quiver_node_requests_running``, ``quiver_node_requests_waiting``,
    ``quiver_node_requests_waiting_by_reason{reason}``, ``quiver_node_preemptions`` (the engine's counter),
    ``quiver_node_load_age_seconds`` (age of the published figures), ``quiver_node_load_publish_failures`` (current
    streak) and ``quiver_node_load_scrape_seconds`` (last engine scrape).
    """
    registry = CollectorRegistry()
    residency = state.get("residency") or {}
    adapters = Gauge("quiver_node_lora_adapters", "Adapter versions on this node, by residency tier.", ["tier"],
                     registry=registry)
    size = Gauge("quiver_node_lora_bytes", "Bytes held per residency tier (GPU: rank-padded slots).", ["tier"],
                 registry=registry)
    slots = Gauge("quiver_node_lora_slots", "Engine LoRA capacity per tier (max_loras, max_cpu_loras).", ["tier"],
                  registry=registry)
    for tier in TIERS:
        adapters.labels(tier).set(int(residency.get(tier, 0)))
    for tier in ("gpu", "cpu", "disk"):
        size.labels(tier).set(int(residency.get(f"{tier}_bytes", 0)))
    slots.labels("gpu").set(int(state.get("max_loras") or 0))
    slots.labels("cpu").set(int(state.get("max_cpu_loras") or 0))
    Gauge("quiver_node_lora_pinned", "Pinned adapter versions on this node.", registry=registry).set(
        int(residency.get("pinned", 0)))
    Gauge("quiver_node_residency_from_engine", "1 when residency comes from the engine's own LoRA lists.",
          registry=registry).set(1 if residency.get("source") == "engine" else 0)
    if residency.get("loads_total") is not None:
        Gauge("quiver_node_lora_loads", "Engine LoRA loads (disk to CPU copy) since the engine started.",
              registry=registry).set(int(residency["loads_total"]))
    if residency.get("move_seconds") is not None:
        Gauge("quiver_node_lora_move_seconds", "Seconds the engine spent inside its steps moving adapters (disk to "
              "CPU reads, CPU to GPU slot copies) since the agent's first residency read.",
              registry=registry).set(float(residency["move_seconds"]))
    if load is not None:
        _load_gauges(registry, load)
    return generate_latest(registry)


def _load_gauges(registry: CollectorRegistry, publisher: Any) -> None:
    last = publisher.last
    Gauge("quiver_node_load_publish_failures", "Consecutive failed engine scrapes or Redis writes.",
          registry=registry).set(publisher.failures)
    Gauge("quiver_node_load_scrape_seconds", "Duration of the last engine /metrics scrape.",
          registry=registry).set(publisher.scrape_s)
    if last is None:
        return
    Gauge("quiver_node_load_age_seconds", "Age of the engine load figures last published for admission.",
          registry=registry).set(max(0.0, time.time() - last.at_s))
    Gauge("quiver_node_kv_cache_usage_perc", "vllm:kv_cache_usage_perc as published for admission (0..1).",
          registry=registry).set(last.kv_cache_usage_perc)
    Gauge("quiver_node_requests_running", "vllm:num_requests_running as published for admission.",
          registry=registry).set(last.num_requests_running)
    Gauge("quiver_node_requests_waiting", "vllm:num_requests_waiting as published for admission.",
          registry=registry).set(last.num_requests_waiting)
    by_reason = Gauge("quiver_node_requests_waiting_by_reason", "Waiting requests by reason (capacity = KV or "
                      "scheduling, deferred = LoRA budget).", ["reason"], registry=registry)
    for reason in ("capacity", "deferred"):
        value = getattr(last, f"waiting_{reason}")
        if value is not None:
            by_reason.labels(reason).set(value)
    Gauge("quiver_node_preemptions", "vllm:num_preemptions_total as published for admission.",
          registry=registry).set(last.num_preemptions_total)
