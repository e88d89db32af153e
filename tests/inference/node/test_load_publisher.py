"""The agent's fast scan of vLLM `/metrics` (real captured text) and the value it publishes for the gateway."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from inference.node.load_publisher import LoadPublisher, load_decode, load_key, scan_load
from inference.node.metrics import parse_engine_metrics
from inference.policy.admission import NodeLoad

DATA = Path(__file__).parent / "data"


def test_scan_agrees_with_the_full_parser_on_a_real_engine_body() -> None:
    for name in ("metrics_inflight.txt", "metrics_idle.txt"):
        text = (DATA / name).read_text()
        full = parse_engine_metrics(text)

        load = scan_load(text, at_s=5.0, scheduling_policy="priority")

        assert load.num_requests_running == full.num_requests_running
        assert load.num_requests_waiting == full.num_requests_waiting
        assert load.kv_cache_usage_perc == full.kv_cache_usage_perc
        assert load.num_preemptions_total == full.num_preemptions_total
        assert (load.waiting_capacity, load.waiting_deferred) == (0, 0)
        assert (load.at_s, load.scheduling_policy) == (5.0, "priority")
        assert load.running_loras == tuple(full.running_lora_adapters)  # the newest lora_requests_info series


def test_scan_sums_engines_takes_max_kv_and_reads_reasons() -> None:
    text = "\n".join([
        'vllm:num_requests_waiting{engine="0"} 3.0', 'vllm:num_requests_waiting{engine="1"} 4.0',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 5.0',
        'vllm:num_requests_waiting_by_reason{engine="1",reason="deferred"} 2.0',
        'vllm:kv_cache_usage_perc{engine="0"} 0.3', 'vllm:kv_cache_usage_perc{engine="1"} 0.9',
        "vllm:num_requests_running 2", "vllm:num_requests_running_garbage x",
    ])

    load = scan_load(text, at_s=0.0)

    assert (load.num_requests_waiting, load.kv_cache_usage_perc, load.num_requests_running) == (7, 0.9, 2)
    assert (load.waiting_capacity, load.waiting_deferred) == (5, 2)


def test_an_engine_without_reasons_reports_none_for_them() -> None:
    load = scan_load("vllm:num_requests_waiting 1\n", at_s=0.0)

    assert load.waiting_capacity is None and load.waiting_deferred is None
    assert load.running_loras is None  # no LoRA info series: unknown, not "nothing running"


def test_the_newest_lora_series_names_the_running_batch() -> None:
    text = "\n".join([
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a--x,b--y",waiting_lora_adapters="c--z"} 20.0',
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="c--z",waiting_lora_adapters=""} 30.0',
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 10.0',
    ])

    load = scan_load(text, at_s=0.0)

    assert load.running_loras == ("c--z",)
    assert load_decode(json.dumps({"at_s": 1.0, "running_loras": ["a--x", "b--y"]})).running_loras == ("a--x", "b--y")


def test_non_finite_values_are_skipped_never_raised() -> None:
    """``scan_load`` never raises: a NaN or +Inf count made int() raise, so the node published nothing at all, and a
    NaN lora_requests_info series (compared with ``>``) hid every newer one."""
    text = "\n".join([
        "vllm:num_requests_waiting{engine=\"0\"} NaN", "vllm:num_requests_waiting{engine=\"1\"} 2.0",
        "vllm:num_requests_running +Inf", 'vllm:num_requests_waiting_by_reason{reason="capacity"} NaN',
        "vllm:kv_cache_usage_perc -Inf", "vllm:kv_cache_usage_perc 0.25",
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old--a",waiting_lora_adapters=""} NaN',
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="new--b",waiting_lora_adapters=""} 30.0',
    ])

    load = scan_load(text, at_s=1.0)

    assert (load.num_requests_waiting, load.num_requests_running, load.waiting_capacity) == (2, 0, None)
    assert (load.kv_cache_usage_perc, load.running_loras) == (0.25, ("new--b",))


def test_decode_refuses_ill_typed_figures_and_ignores_an_ill_typed_batch() -> None:
    for bad in ({"at_s": "1.0"}, {"at_s": float("nan")}, {"at_s": 1.0, "num_requests_waiting": "7"},
                {"at_s": 1.0, "num_requests_running": 2.5}, {"at_s": 1.0, "kv_cache_usage_perc": None},
                {"at_s": 1.0, "waiting_capacity": -1}, {"at_s": 1.0, "scheduling_policy": 1}, [1.0]):
        assert load_decode(json.dumps(bad)) is None, bad
    for batch in ("a--x", {"a--x": 1}, 5, ["a--x", 1], ["x"] * 5000):
        load = load_decode(json.dumps({"at_s": 1.0, "running_loras": batch}))
        assert load is not None and load.running_loras is None, batch  # unknown, not letters or keys


def test_decode_round_trip_and_garbage() -> None:
    load = NodeLoad(at_s=1.5, kv_cache_usage_perc=0.2, num_requests_waiting=3, waiting_capacity=3)
    from dataclasses import asdict

    assert load_decode(json.dumps(asdict(load))) == load
    assert load_decode(None) is None and load_decode(b"not json") is None and load_decode(b'{"x": 1}') is None


class _Redis:
    def __init__(self) -> None:
        self.sets: list[tuple[str, str, int]] = []

    async def set(self, key: str, value: str, px: int) -> None:
        self.sets.append((key, value, px))


def test_publish_writes_one_expiring_key_and_survives_a_broken_engine() -> None:
    redis = _Redis()
    bodies: list[Any] = ["vllm:num_requests_waiting 2\n", RuntimeError("engine down")]

    async def metrics_text() -> str:
        body = bodies.pop(0)
        if isinstance(body, Exception):
            raise body
        return str(body)

    publisher = LoadPublisher(metrics_text, redis, "node-a", scheduling_policy="priority")

    async def run() -> None:
        assert (await publisher.publish_once()) is not None
        assert (await publisher.publish_once()) is None

    asyncio.run(run())
    [(key, value, px)] = redis.sets
    assert key == load_key("node-a") == "quiver:node:load:node-a" and px == 5000
    decoded = load_decode(value)
    assert decoded is not None and decoded.num_requests_waiting == 2 and decoded.scheduling_policy == "priority"
    assert publisher.failures == 1 and publisher.last == decoded
