"""Prometheus gauges of this node's adapter residency, rendered from the agent's state report.

Aggregates only (counts and bytes per tier, capacity): no adapter names, so the series count stays fixed however
many adapters a node holds (vllm#11117 on label growth) and nothing tenant-identifying leaves the node. Tiers are
the engine's own (``inference.node.worker_ext``): ``gpu`` = ``max_loras`` slots, ``cpu`` = CPU cache only, ``disk`` =
staged, ``errored`` = last load failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TIERS = ("gpu", "cpu", "disk", "errored")


def render(state: Mapping[str, Any]) -> bytes:
    """Prometheus text for one state report (``NodeAgent.state``).

    Series: ``quiver_node_lora_adapters{tier}`` (adapters), ``quiver_node_lora_bytes{tier}`` (bytes; ``gpu`` is
    rank-padded slot bytes), ``quiver_node_lora_pinned`` (adapters), ``quiver_node_lora_slots{tier}`` (capacity:
    ``max_loras`` / ``max_cpu_loras``), ``quiver_node_residency_from_engine`` (1 when the engine's own lists were
    read, 0 when inferred from request activity).
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
    return generate_latest(registry)
