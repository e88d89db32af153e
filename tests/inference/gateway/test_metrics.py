"""Gateway metrics: bounded adapter labels, recorded figures, and /metrics only on the internal listener."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve

from inference.gateway import metrics
from inference.gateway import views as internal_views

REPO = Path(__file__).resolve().parents[3]


def test_adapter_labels_keep_the_top_n_and_fold_the_rest_into_other() -> None:
    labels = metrics.AdapterLabels(n=2, period_s=60.0)
    assert [labels.label(name, now=0.0) for name in ("a", "b", "c")] == ["a", "b", "other"]
    for _ in range(5):
        labels.label("c", now=1.0)
        labels.label("b", now=1.0)
    assert labels.label("c", now=61.0) == "c"  # re-ranked by traffic: c is now in the top 2
    assert labels.label("a", now=61.0) == "other"
    for i in range(1000):  # random model names cannot grow the table
        labels.label(f"junk-{i}", now=62.0)
    assert len(labels.counts) <= 20 and len(labels.top) <= 2


def test_request_observe_counts_requests_tokens_and_latency() -> None:
    # Read the metric children themselves: whether values sit in memory or in multiprocess files depends on the
    # environment at import time, which other tests (and vLLM, imported in-process) may change.
    def requests() -> float:
        return metrics.REQUESTS.labels("completions", "200", "other")._value.get()  # type: ignore[attr-defined]

    def completion_tokens() -> float:
        return metrics.TOKENS.labels("completion", "other")._value.get()  # type: ignore[attr-defined]

    def ttft_sum() -> float:
        return metrics.TTFT.labels("completions")._sum.get()  # type: ignore[attr-defined]

    before, tokens, ttft = requests(), completion_tokens(), ttft_sum()
    labels = metrics.ADAPTERS
    metrics.ADAPTERS = metrics.AdapterLabels(n=0)  # no top names, even after a re-rank: every name is "other"
    try:
        metrics.request_observe(endpoint="completions", status=200, served_name="never-seen", prompt_tokens=3,
                                completion_tokens=4, latency_s=0.02, ttft_s=0.01)
    finally:
        metrics.ADAPTERS = labels

    assert requests() == before + 1
    assert completion_tokens() == tokens + 4
    assert abs(ttft_sum() - (ttft + 0.01)) < 1e-9


def test_metrics_are_served_by_the_internal_listener_only() -> None:
    assert resolve("/metrics", urlconf="config.internal_urls").func is internal_views.metrics
    with pytest.raises(Resolver404):
        resolve("/metrics", urlconf="config.urls")
    body, content_type = metrics.render()
    assert b"quiver_gateway_admission_queue_depth" in body and content_type.startswith("text/plain")


def test_several_processes_share_figures_through_the_multiprocess_dir(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    record = ("from inference.gateway import metrics as m; m.request_observe(endpoint='completions', status=429, "
              "served_name='x', prompt_tokens=0, completion_tokens=0, latency_s=0.1, ttft_s=None); "
              "m.QUEUE_DEPTH.inc(2)")
    for _ in range(2):  # two gateway workers
        subprocess.run([sys.executable, "-c", record], env=env, check=True, cwd=REPO)
    shown = subprocess.run([sys.executable, "-c", "from inference.gateway import metrics as m; "
                            "print(m.render()[0].decode())"], env=env, check=True, cwd=REPO, capture_output=True,
                           text=True).stdout

    assert 'quiver_gateway_requests_total{adapter="x",endpoint="completions",status="429"} 2.0' in shown
