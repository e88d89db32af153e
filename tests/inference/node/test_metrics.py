"""Parsing vLLM 0.32 `/metrics` text captured from a real CPU engine (tiny-llama, 2 adapters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.node.metrics import parse_engine_metrics

DATA = Path(__file__).parent / "data"


def test_in_flight_snapshot_reads_queue_kv_and_newest_lora_series() -> None:
    metrics = parse_engine_metrics((DATA / "metrics_inflight.txt").read_text())

    assert metrics.num_requests_running == 9
    assert metrics.num_requests_waiting == 0
    assert metrics.num_preemptions_total == 0.0
    assert metrics.kv_cache_usage_perc == pytest.approx(0.004396678065461623)
    assert metrics.max_lora == 2
    # Five lora_requests_info series exist; the newest (largest value) names both adapters.
    assert metrics.running_lora_adapters == ["globex--sql", "acme--support"]
    assert metrics.hot_lora_names == {"globex--sql", "acme--support"}


def test_idle_snapshot_has_no_hot_adapters_even_with_older_busy_series() -> None:
    text = (DATA / "metrics_idle.txt").read_text()
    assert 'running_lora_adapters="acme--support,globex--sql"' in text  # an older, busier series

    metrics = parse_engine_metrics(text)

    assert metrics.hot_lora_names == set()
    assert metrics.num_requests_running == 0
    assert metrics.kv_cache_usage_perc == 0.0


def test_missing_metrics_are_none_and_gauges_sum_over_engines() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
    )

    metrics = parse_engine_metrics(text)

    assert metrics.num_requests_running == 5
    assert metrics.num_requests_waiting is None
    assert metrics.kv_cache_usage_perc is None
    assert metrics.num_preemptions_total is None
    assert metrics.max_lora is None
    assert metrics.running_lora_adapters == []


def test_invalid_text_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_engine_metrics('vllm:num_requests_running{engine="0" 1.0\n')
