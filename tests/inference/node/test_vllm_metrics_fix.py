"""vLLM's LoRA info gauge keeps one series: the patch on a real prometheus_client gauge and on vLLM's logger class.
The live check is in test_engine_ext.py::test_mixed_batch_matches_transformers_and_peft."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from vllm.v1.metrics.loggers import PrometheusStatLogger

from inference.node import vllm_metrics_fix


def _gauge() -> Gauge:
    return Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                 labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                 registry=CollectorRegistry())


def _series(gauge: Gauge) -> list[dict[str, str]]:
    return [s.labels for m in gauge.collect() for s in m.samples]


def test_each_update_leaves_only_its_own_series() -> None:
    gauge = vllm_metrics_fix.single_series(_gauge())
    assert vllm_metrics_fix.single_series(gauge) is gauge  # idempotent
    for running in ("a--x", "a--x,b--y", "b--y,a--x", ""):
        gauge.labels(max_lora="2", waiting_lora_adapters="", running_lora_adapters=running).set_to_current_time()
    assert [s["running_lora_adapters"] for s in _series(gauge)] == [""]

    stock = _gauge()
    for running in ("a--x", "a--x,b--y"):
        stock.labels(max_lora="2", waiting_lora_adapters="", running_lora_adapters=running).set_to_current_time()
    assert len(_series(stock)) == 2  # what vLLM does unpatched


def test_install_wraps_the_loggers_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self.gauge_lora_info = _gauge()

    monkeypatch.setattr(PrometheusStatLogger, "__init__", fake_init)
    monkeypatch.setattr(PrometheusStatLogger, "__quiver_single_lora_series__", False, raising=False)
    assert vllm_metrics_fix.install() and vllm_metrics_fix.install()
    logger = PrometheusStatLogger.__new__(PrometheusStatLogger)
    PrometheusStatLogger.__init__(logger)
    for running in ("a--x", "b--y"):
        logger.gauge_lora_info.labels(max_lora="2", waiting_lora_adapters="",
                                      running_lora_adapters=running).set_to_current_time()
    assert [s["running_lora_adapters"] for s in _series(logger.gauge_lora_info)] == ["b--y"]
