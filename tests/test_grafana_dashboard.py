"""The Grafana dashboard queries only series the code exports, and Prometheus scrapes the ports that export them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from inference.gateway import metrics as gateway_metrics
from inference.node import residency_metrics
from inference.policy.admission import NodeLoad

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "platform" / "grafana" / "quiver.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "info": ("_info",), "summary": ("", "_sum", "_count", "_created")}


def _series(families: object) -> set[str]:
    """Every sample name a family list can produce (label-only families have no samples until first use)."""
    names: set[str] = set()
    for family in families:  # type: ignore[attr-defined]
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


class _Publisher:
    last = NodeLoad(at_s=0.0, waiting_capacity=1, waiting_deferred=0)
    failures = 0
    scrape_s = 0.001


def _exported() -> set[str]:
    assert gateway_metrics.EXPORTED  # importing the module registered them
    gateway = {n for n in _series(REGISTRY.collect()) if n.startswith("quiver_gateway_")}
    node_text = residency_metrics.render({"residency": {"source": "engine"}, "max_loras": 2}, load=_Publisher()).decode()
    return gateway | _series(text_string_to_metric_families(node_text))


def _queried() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    return {m for e in exprs for m in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e)
            if m.startswith(("quiver_", "vllm:"))}


def test_every_series_the_dashboard_queries_is_exported_by_the_code() -> None:
    queried, exported = _queried(), _exported()

    assert not {m for m in queried if m.startswith("vllm:")}, "read engine figures through quiver_node_* series"
    assert queried - exported == set()
    # The list is on the dashboard: requests, tokens, latency, TTFT, admission, queue, rate limits, KV.
    for must in ("quiver_gateway_requests_total", "quiver_gateway_tokens_total",
                 "quiver_gateway_request_duration_seconds_bucket", "quiver_gateway_ttft_seconds_bucket",
                 "quiver_gateway_admission_total", "quiver_gateway_admission_queue_depth",
                 "quiver_gateway_rate_limited_total", "quiver_node_kv_cache_usage_perc"):
        assert must in queried


def test_gateway_families_listed_in_exported_are_the_registered_ones() -> None:
    registered = {n for n in _series(REGISTRY.collect()) if n.startswith("quiver_gateway_")}
    for name in gateway_metrics.EXPORTED:
        assert name in registered or f"{name}_bucket" in registered, name


def test_dashboard_uses_the_provisioned_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    source = yaml.safe_load((REPO / "platform/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {uid}
    assert source["datasources"][0]["url"] == "http://prometheus:9090"


def test_prometheus_scrapes_the_internal_listener_agents_and_engines() -> None:
    config = yaml.safe_load((REPO / "platform/prometheus/prometheus.yml").read_text())
    targets = {job["job_name"]: [t for s in job["static_configs"] for t in s["targets"]]
               for job in config["scrape_configs"]}

    assert targets["quiver-gateway"] == ["web-internal:8001"]  # the internal listener, never the public :8000
    assert targets["quiver-node"] == ["node-agent:8100"]
    assert targets["vllm"] == ["vllm:8000"]
