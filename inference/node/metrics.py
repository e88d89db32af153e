"""Read the engine numbers the control plane needs from vLLM's Prometheus `/metrics` text.

Metric names are vLLM 0.32's (`vllm/v1/metrics/loggers.py`): `vllm:kv_cache_usage_perc` (gauge, 0..1),
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:num_preemptions_total` (counter) and
`vllm:lora_requests_info`, whose *labels* `running_lora_adapters` / `waiting_lora_adapters` are
comma-separated `lora_name`s and whose *value* is the Unix time of the update; every label combination
is a new series, so the newest (largest value) is the current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
PREEMPTIONS_TOTAL = "vllm:num_preemptions_total"
LORA_REQUESTS_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True)
class EngineMetrics:
    """A snapshot of one engine's load.

    Attributes:
        kv_cache_usage_perc: KV-cache use as a fraction 0..1 (max over engines), None if absent.
        num_requests_running: requests in the running batch (sum over engines), None if absent.
        num_requests_waiting: queued requests (sum over engines), None if absent.
        num_preemptions_total: cumulative preemptions (counter, sum over engines), None if absent.
        running_lora_adapters: `lora_name`s with a running request, from the newest info series.
        waiting_lora_adapters: `lora_name`s with a waiting request, from the newest info series.
        max_lora: the engine's `max_loras` as reported by the info series, None if absent.
    """

    kv_cache_usage_perc: float | None = None
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    num_preemptions_total: float | None = None
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)
    max_lora: int | None = None

    @property
    def hot_lora_names(self) -> set[str]:
        """Adapters with a request in flight (running or waiting)."""
        return set(self.running_lora_adapters) | set(self.waiting_lora_adapters)


def _split_names(raw: str) -> list[str]:
    return [name for name in (part.strip() for part in raw.split(",")) if name]


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Parse Prometheus exposition text from a vLLM engine.

    Args:
        text: the body of `GET /metrics`.

    Returns:
        The snapshot; fields whose metric is missing are None (or empty lists).

    Raises:
        ValueError: the text is not valid Prometheus exposition format.
    """
    values: dict[str, list[float]] = {}
    newest_info: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LORA_REQUESTS_INFO:
                if newest_info is None or sample.value > newest_info[0]:
                    newest_info = (sample.value, dict(sample.labels))
                continue
            if sample.name in (KV_CACHE_USAGE, REQUESTS_RUNNING, REQUESTS_WAITING, PREEMPTIONS_TOTAL):
                values.setdefault(sample.name, []).append(float(sample.value))

    def total(name: str) -> float | None:
        found = values.get(name)
        return sum(found) if found else None

    running = total(REQUESTS_RUNNING)
    waiting = total(REQUESTS_WAITING)
    kv = values.get(KV_CACHE_USAGE)
    info_labels = newest_info[1] if newest_info else {}
    max_lora_raw = info_labels.get("max_lora", "")
    return EngineMetrics(
        kv_cache_usage_perc=max(kv) if kv else None,
        num_requests_running=int(running) if running is not None else None,
        num_requests_waiting=int(waiting) if waiting is not None else None,
        num_preemptions_total=total(PREEMPTIONS_TOTAL),
        running_lora_adapters=_split_names(info_labels.get("running_lora_adapters", "")),
        waiting_lora_adapters=_split_names(info_labels.get("waiting_lora_adapters", "")),
        max_lora=int(max_lora_raw) if max_lora_raw.isdigit() else None,
    )
