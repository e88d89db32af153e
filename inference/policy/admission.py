"""Admission decisions as pure functions: is a node saturated, and whose queued request goes next (VTC).

Saturation follows GIE/llm-d's ``utilization-detector`` (llm-d-router
``pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/detector.go``): a node is saturated when
``vllm:num_requests_waiting`` ≥ ``queue_saturated`` (default 5) or ``vllm:kv_cache_usage_perc`` ≥ ``kv_saturated``
(default 0.8). Requests this gateway process sent the node after the figures were taken count as waiting (llm-d's
in-flight credit), so a burst between two scrapes cannot pour past the threshold.

Stale figures (older than ``max_age_s``, default 0.25 s) are *unknown*, and unknown is not saturated: the gateway
then admits as it would without admission control (fail open) and the engine's own queue takes the load. GIE
instead scores a stale endpoint as saturated, which halts all traffic when scraping fails fleet-wide; for a
platform whose engines queue by themselves, a scrape outage should cost fairness, not availability.

Fair order follows VTC (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24; reference queue
``Ying1123/VTC-artifact:slora/server/router/vtc_req_queue.py``): strict priority bands first (lower value first, as
vLLM's ``priority``), then the backlogged tenant with the lowest weighted served-token counter (input × 1,
output × 2, divided by the tenant's weight); a tenant whose queue was empty is lifted to the minimum counter among
backlogged tenants, so idle time earns no credit. No clock or I/O here: callers pass ``now_s``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INPUT_PRICE = 1.0
OUTPUT_PRICE = 2.0


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's engine gauges as its agent scraped them.

    Attributes:
        at_s: Unix time of the scrape (seconds, the agent's clock).
        kv_cache_usage_perc: ``vllm:kv_cache_usage_perc``, 0..1 (max over engines).
        num_requests_waiting: ``vllm:num_requests_waiting`` (requests).
        num_requests_running: ``vllm:num_requests_running`` (requests).
        waiting_capacity: ``vllm:num_requests_waiting_by_reason{reason="capacity"}``; None if not exported.
        waiting_deferred: the same for ``reason="deferred"`` (held back by the LoRA budget); None if not exported.
        num_preemptions_total: ``vllm:num_preemptions_total`` (counter).
        scheduling_policy: the engine's ``--scheduling-policy`` (``fcfs`` or ``priority``).
        running_loras: ``lora_name``s with a request in the engine's running batch (the newest
            ``vllm:lora_requests_info`` series' ``running_lora_adapters``); None if not exported.
    """

    at_s: float
    kv_cache_usage_perc: float = 0.0
    num_requests_waiting: int = 0
    num_requests_running: int = 0
    waiting_capacity: int | None = None
    waiting_deferred: int | None = None
    num_preemptions_total: float = 0.0
    scheduling_policy: str = "fcfs"
    running_loras: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class SaturationConfig:
    """Thresholds (``QUIVER_ADMISSION_*`` settings).

    Attributes:
        queue_saturated: waiting requests at which a node is saturated (GIE ``queueDepthThreshold`` 5).
        kv_saturated: KV-cache fraction at which a node is saturated (GIE ``kvCacheUtilThreshold`` 0.8).
        max_age_s: figures older than this are unknown (GIE ``metricsStalenessThreshold`` is 0.2 s; we use 0.25).
    """

    queue_saturated: int = 5
    kv_saturated: float = 0.8
    max_age_s: float = 0.25


@dataclass(frozen=True, slots=True)
class SlotConfig:
    """The running-slot budget per node (``QUIVER_ADMISSION_NODE_SLOTS``, ``QUIVER_ADMISSION_SLOT_RESERVE``).

    Attributes:
        slots: requests the gateways keep in flight on one node at most (0 = no budget). Below the engine's
            ``max_num_seqs`` every request the gateway lets through is scheduled at the engine's next step, so the
            engine never queues and the gateway's fair order is the order of service.
        reserve: slots no single tenant may take, so a newcomer finds one free at once instead of waiting for a
            flooder's long completion to end (bench_fairness: a quiet tenant's TTFT waited behind 32 running flood
            requests). 0 = work-conserving.
    """

    slots: int = 0
    reserve: int = 0


def slot_free(*, node_in_flight: int, tenant_in_flight: int, config: SlotConfig, active_tenants: int = 1) -> bool:
    """Whether a tenant's request may take a slot on a node: the node has one free and the tenant holds fewer than
    its cap there. Always True without a budget.

    The cap is ``slots - reserve`` (at least 1) while the tenant is alone, and no more than an equal share,
    ``ceil(slots / active_tenants)``, while others hold or wait for slots too (max-min fairness over running
    slots). The engine never preempts a running request, so a flooder that took every slot while a quiet tenant's
    queue was empty for a moment kept it for a whole long completion; with the share cap it stops at half and the
    quiet tenant's next request finds its slot free (scripts/bench_fairness).

    Args:
        node_in_flight: requests all gateways have in flight on the node (this process's exact, others' published).
        tenant_in_flight: the same for the tenant alone.
        config: the budget.
        active_tenants: tenants holding slots on the node or waiting for one, this tenant included (≥ 1).
    """
    if config.slots <= 0:
        return True
    cap = max(1, config.slots - config.reserve)
    if active_tenants > 1:
        cap = min(cap, max(1, -(-config.slots // active_tenants)))
    return node_in_flight < config.slots and tenant_in_flight < cap


def start_spaced(*, since_start_s: float | None, spacing_s: float, tenant_in_flight: int,
                 others_in_flight: Iterable[int]) -> bool:
    """Whether a tenant's next request on a node must wait: it started one there less than ``spacing_s`` ago while
    other tenants are active on the node, and it holds at least as many of the node's running requests as any of
    them (the heaviest tenant there, so a light tenant is never spaced behind a flooder).

    Why: requests that start together prefill in the same engine steps and then end together, so a flooder's
    batch of starts came back as waves of simultaneous prefills every completion time (every ~1.8 s), and a quiet
    tenant's requests that arrived during a wave set its p99 TTFT (scripts/bench_fairness: its five slowest TTFTs
    at 2.0, 2.0, 3.8, 4.0 and 5.5 s into the flood). Spacing one tenant's starts by about one prefill step breaks
    the waves without limiting its rate (``1 / spacing_s`` starts per second per node). Sarathi-Serve (Agrawal et
    al., OSDI'24) makes the same case inside the engine: prefills batched together stall the others' tokens.

    Args:
        since_start_s: seconds since the tenant's last start on the node (None: none remembered).
        spacing_s: the spacing (``QUIVER_ADMISSION_START_SPACING_S``); 0 = never spaced.
        tenant_in_flight: the tenant's running requests on the node.
        others_in_flight: each other active tenant's running requests there (an empty iterable: alone).
    """
    others = list(others_in_flight)
    if spacing_s <= 0 or since_start_s is None or since_start_s >= spacing_s or not others:
        return False
    return tenant_in_flight >= max(others)


def stream_interval(*, tenant_in_flight: int, others_in_flight: Iterable[int], coarse: int) -> int | None:
    """vLLM's per-request ``stream_interval`` (tokens per streamed chunk) for a tenant's new stream on a node:
    ``coarse`` while other tenants are active there and this tenant holds more of the node's running requests than
    each of them, and more than one; None (vLLM's default, a chunk per token) otherwise, so a lighter tenant always
    streams per token, and so does a tenant's single stream: one stream is no flood (two tenants streaming one at a
    time, each starting within the grace after the other's last request ended, held 1 against 0 and were given
    coarse chunks in turn; so was a quiet tenant beside a flooder whose requests had all just ended).

    Why: on a node's host every streamed chunk costs CPU three times (the engine's API server builds and writes it,
    the gateway parses, meters and relays it, the client reads it), and the first token is always sent at once
    (vLLM ``v1/engine/output_processor.py``: a chunk goes out on the first token, at the end, or every
    ``stream_interval`` tokens). A flooder's 64-token answers streamed per token kept a 2-core node's host busy
    enough to delay a quiet tenant's first tokens: scripts/bench_fairness measured its p99 TTFT under the flood at
    3.3x its value alone with per-token chunks for both, and 1.1x with the flooder's chunks at 8 tokens (2026-12-05).
    Tokens come as fast; they arrive in fewer, larger chunks.

    Args:
        tenant_in_flight: the tenant's running requests on the node, this one included.
        others_in_flight: each other active tenant's running requests there (an empty iterable: alone).
        coarse: tokens per chunk for the heaviest tenant (``QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL``); 1 or less
            = off.
    """
    others = list(others_in_flight)
    if coarse <= 1 or not others:
        return None
    return coarse if tenant_in_flight > max(1, *others) else None


def node_saturated(load: NodeLoad | None, *, now_s: float, config: SaturationConfig, sent_since: int = 0) -> bool | None:
    """Whether a node is saturated: True, False, or None when its figures are missing or stale (unknown).

    Saturated = waiting for capacity (``waiting_capacity`` where the engine exports it, else all waiting) plus
    ``sent_since`` at ``queue_saturated`` or more, or KV use at ``kv_saturated`` or more (GIE's detector).

    Args:
        load: the node's last figures, or None.
        now_s: Unix time now.
        config: thresholds.
        sent_since: requests this process sent the node after ``load.at_s``, less those of its requests that ended
            there since (added to the waiting count, which stays ≥ 0; negative when more ended than were sent).
    """
    if load is None or now_s - load.at_s > config.max_age_s:
        return None
    # Requests the engine holds back for a LoRA slot (``deferred``) are not a lack of capacity: holding more in the
    # gateway would not serve them sooner (vLLM's ``vllm:num_requests_waiting_by_reason``,
    # reason ``deferred``: ``vllm/v1/core/sched/scheduler.py``). Engines
    # that do not export the reasons count every waiting request.
    waiting = load.num_requests_waiting if load.waiting_capacity is None else load.waiting_capacity
    # Never below zero: requests that ended while nothing waited free running slots, not a place in a queue.
    return (max(0, waiting + sent_since) >= config.queue_saturated
            or load.kv_cache_usage_perc >= config.kv_saturated)


def nodes_calm(loads: Iterable[NodeLoad], config: SaturationConfig) -> bool:
    """True when no node's last figures come near saturation: nothing waiting and KV use under half the mark.

    While calm the gateway may re-read the figures less often: a figure that ages past ``max_age_s`` counts as
    unknown, and unknown admits, as a calm figure does, so only the work of re-reading changes. Missing nodes count
    as calm for the same reason.
    """
    return all(load.num_requests_waiting == 0 and load.kv_cache_usage_perc < config.kv_saturated / 2
               for load in loads)


def rpm_pace(rpm: int, *, burst_s: float, burst_min: int) -> tuple[int, int]:
    """GCRA parameters that spread a requests-per-minute limit over the minute: (emission interval, tolerance), ms.

    A limit of ``rpm`` admits one request every ``60000 / rpm`` ms, with bursts of up to
    ``min(rpm, max(burst_min, rpm × burst_s / 60))`` requests; the fixed one-minute window still caps the minute.
    OpenAI's rate-limit guide does the same: "60,000 requests/minute may be enforced as 1,000 requests/second"
    (``burst_s`` 1). Without it a 300-rpm flooder put its whole minute into the engine in the first 10 s
    (scripts/bench_fairness). ``burst_min`` keeps small limits usable in a burst (a 12-rpm key may send its 12 at once).

    Raises:
        ValueError: ``rpm`` < 1.
    """
    if rpm < 1:
        raise ValueError(f"rpm must be >= 1, got {rpm}")
    interval = 60000 / rpm
    burst = min(rpm, max(burst_min, int(rpm * burst_s / 60)))
    return int(interval), int((burst - 1) * interval)


def vtc_cost(*, prompt_tokens: int, completion_tokens: int, weight: float = 1.0) -> float:
    """VTC service for one request: (input × 1 + output × 2) / weight (the artifact's default prices)."""
    return (prompt_tokens * INPUT_PRICE + completion_tokens * OUTPUT_PRICE) / max(weight, 1e-9)


def vtc_lift(own: float, backlogged: Mapping[str, float]) -> float:
    """The counter a tenant re-entering the backlog starts from: ``max(own, min over backlogged tenants)``.

    ``backlogged`` holds the *other* tenants with queued work; empty means nobody to catch up with.
    """
    return max(own, min(backlogged.values())) if backlogged else own


def vtc_pick(heads: Mapping[str, tuple[int, float, int]]) -> str | None:
    """The tenant whose head request goes next, or None when nobody waits.

    Args:
        heads: tenant → (priority band, counter, arrival sequence of its oldest waiting request). Lower band first
            (vLLM's convention), then the lower counter, then the earlier arrival (FCFS among equals).
    """
    if not heads:
        return None
    return min(heads, key=lambda t: heads[t])
