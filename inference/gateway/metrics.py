"""The gateway's Prometheus metrics, and the ``/metrics`` view of the internal listener that exposes them.

Recorded by the public gateway processes (``inference.gateway.app``, ``inference.gateway.admission``), exposed only
on the internal listener (``config.internal_asgi``, port 8001), never on the public port. Several processes
(``uvicorn --workers N``, and the internal listener beside them) share figures through prometheus-client's
multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR`` to one empty folder for all of them on a host (docker-compose
mounts one volume into ``web`` and ``web-internal``). Without it, figures live in the process's default registry
(one process serving both listeners, as in the tests).

Label cardinality is bounded (vllm#11117): ``adapter`` carries the served name of the top
``QUIVER_METRICS_TOP_ADAPTERS`` adapters by recent traffic in this process, and ``other`` for the rest.
"""

from __future__ import annotations

import os
import threading
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0)
OTHER = "other"

REQUESTS = Counter("quiver_gateway_requests", "Completion requests answered, by endpoint, status and adapter.",
                   ["endpoint", "status", "adapter"])
TOKENS = Counter("quiver_gateway_tokens", "Tokens metered, by kind (prompt, completion) and adapter.",
                 ["kind", "adapter"])
LATENCY = Histogram("quiver_gateway_request_duration_seconds", "Time from arrival to the last byte, by endpoint.",
                    ["endpoint"], buckets=LATENCY_BUCKETS)
TTFT = Histogram("quiver_gateway_ttft_seconds", "Streaming time to the first token, by endpoint.", ["endpoint"],
                 buckets=LATENCY_BUCKETS)
# Sub-millisecond resolution: on the demo's node this figure is about a millisecond (scripts/bench_gateway).
TO_ENGINE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)
TO_ENGINE = Histogram("quiver_gateway_time_to_engine_seconds", "Time from a request's arrival in the gateway to its "
                      "call to the engine (key, limits, admission and any wait it queued for, routing): what the "
                      "gateway adds before the engine starts, by endpoint.", ["endpoint"], buckets=TO_ENGINE_BUCKETS)
ADMISSION = Counter("quiver_gateway_admission", "Admission outcomes: admitted at once, queued (waited for a "
                    "saturated pool), dequeued (left the queue for a node), shed (429 after waiting or on a full "
                    "queue).", ["outcome"])
ADMISSION_WAIT = Histogram("quiver_gateway_admission_wait_seconds", "Time queued requests waited in the gateway.",
                           buckets=WAIT_BUCKETS)
QUEUE_DEPTH = Gauge("quiver_gateway_admission_queue_depth", "Requests waiting in the gateway's admission queue.",
                    multiprocess_mode="livesum")
NODES_SATURATED = Gauge("quiver_gateway_nodes_saturated", "Nodes whose fresh figures say saturated.",
                        multiprocess_mode="max")
NODES_UNKNOWN = Gauge("quiver_gateway_nodes_load_unknown", "Live nodes without figures fresh enough to judge.",
                      multiprocess_mode="max")
RATE_LIMITED = Counter("quiver_gateway_rate_limited", "Requests refused by a per-tenant or per-key limit, by kind "
                       "(requests, tokens, concurrency).", ["kind"])

EXPORTED = ("quiver_gateway_requests_total", "quiver_gateway_tokens_total",
            "quiver_gateway_request_duration_seconds", "quiver_gateway_ttft_seconds",
            "quiver_gateway_time_to_engine_seconds",
            "quiver_gateway_admission_total", "quiver_gateway_admission_wait_seconds",
            "quiver_gateway_admission_queue_depth", "quiver_gateway_nodes_saturated",
            "quiver_gateway_nodes_load_unknown", "quiver_gateway_rate_limited_total")


class AdapterLabels:
    """Bounded ``adapter`` label values: the top ``n`` adapters by traffic, re-ranked every ``period_s``.

    Counts decay by half at each re-rank, so the set follows recent traffic; the table keeps at most ``10 × n``
    names, so random model names cannot grow it.
    """

    def __init__(self, n: int = 20, period_s: float = 60.0) -> None:
        self.n = n
        self.period_s = period_s
        self.counts: dict[str, float] = {}
        self.top: set[str] = set()
        self._ranked_at: float | None = None
        self._lock = threading.Lock()

    def label(self, name: str, now: float | None = None) -> str:
        """The label for a request to ``name`` (counts the request)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._ranked_at is None:
                self._ranked_at = now
            if name in self.counts or len(self.counts) < 10 * self.n:
                self.counts[name] = self.counts.get(name, 0.0) + 1
            if now - self._ranked_at >= self.period_s:
                self._rank(now)
            elif name not in self.top and len(self.top) < self.n and name in self.counts:
                self.top.add(name)  # before the first ranking: the first n seen
            return name if name in self.top else OTHER

    def _rank(self, now: float) -> None:
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])
        self.top = {name for name, _ in ranked[: self.n]}
        self.counts = {name: count / 2 for name, count in ranked[: 10 * self.n] if count >= 1}
        self._ranked_at = now


ADAPTERS = AdapterLabels(n=int(os.environ.get("QUIVER_METRICS_TOP_ADAPTERS", "20")))


def request_observe(*, endpoint: str, status: int, served_name: str, prompt_tokens: int, completion_tokens: int,
                    latency_s: float, ttft_s: float | None) -> None:
    """Record one finished request (called once per request by the gateway's usage hook)."""
    adapter = ADAPTERS.label(served_name)
    REQUESTS.labels(endpoint, str(status), adapter).inc()
    if prompt_tokens:
        TOKENS.labels("prompt", adapter).inc(prompt_tokens)
    if completion_tokens:
        TOKENS.labels("completion", adapter).inc(completion_tokens)
    LATENCY.labels(endpoint).observe(latency_s)
    if ttft_s is not None:
        TTFT.labels(endpoint).observe(ttft_s)


def render() -> tuple[bytes, str]:
    """The exposition text of every gateway process on this host (multiprocess mode) or of this process."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
