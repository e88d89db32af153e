"""The operator console's APIs: node history from heartbeats (bounded), traffic tables, tenants' limits (audited)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import FleetAuditRecord, Node, NodeSample
from inference.fleet.node_samples import node_sample_record
from inference.fleet.nodes import node_heartbeat
from inference.metering.models import UsageRecord
from inference.metering.traffic import percentile

pytestmark = pytest.mark.django_db


@pytest.fixture
def op() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="ops-ida", password="x", is_staff=True))
    return client


@pytest.fixture
def node(base_model: Any) -> Node:
    return Node.objects.create(name="gpu-1", base_model=base_model, agent_url="http://a", engine_url="http://e",
                               healthy=True, max_loras=4, max_cpu_loras=8)


def _state(kv: float, preemptions: float, gpu: int = 1, cpu: int = 2) -> dict[str, Any]:
    return {"node": "gpu-1", "healthy": True, "max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": 16,
            "kv_cache_usage_perc": kv, "num_requests_running": 3, "num_requests_waiting": 1,
            "num_preemptions_total": preemptions, "adapters": [],
            "residency": {"source": "engine", "gpu": gpu, "cpu": cpu, "disk": 0, "errored": 0, "pinned": 0}}


@override_settings(QUIVER_NODE_SAMPLE_INTERVAL_S=10, QUIVER_NODE_SAMPLE_RETENTION_S=3600)
def test_heartbeats_write_at_most_one_sample_per_interval_and_old_ones_expire(node: Node) -> None:
    node_heartbeat(node=node, state=_state(0.2, 5))
    node_heartbeat(node=node, state=_state(0.3, 6))  # same interval: not stored
    [sample] = NodeSample.objects.all()
    assert (sample.kv_cache_usage_perc, sample.num_preemptions_total, sample.gpu_used, sample.cpu_used) == (0.2, 5, 1, 3)
    later = timezone.now() + timedelta(seconds=11)
    assert node_sample_record(node=node, state=_state(0.5, 9), now=later) is not None
    assert NodeSample.objects.count() == 2
    # An hour and more later, the next sample deletes those past the retention.
    node_sample_record(node=node, state=_state(0.1, 9), now=later + timedelta(seconds=3601))
    assert list(NodeSample.objects.values_list("kv_cache_usage_perc", flat=True)) == [0.1]


def test_samples_api_gives_the_history_with_preemption_deltas(op: APIClient, node: Node,
                                                               make_session_client: Any) -> None:
    start = timezone.now() - timedelta(minutes=3)
    for i, (kv, total) in enumerate([(0.1, 10), (0.6, 14), (0.9, 2)]):  # 2: the engine restarted (counter reset)
        node_sample_record(node=node, state=_state(kv, total), now=start + timedelta(minutes=i))
    old = NodeSample.objects.create(node=node, t=start - timedelta(hours=2), kv_cache_usage_perc=0.99)
    rows = op.get("/api/v1/operator/nodes/gpu-1/samples").json()
    assert [r["kv_cache_usage_perc"] for r in rows] == [0.1, 0.6, 0.9]  # default: the last hour only
    assert [r["preemptions"] for r in rows] == [None, 4, None]
    since = (start - timedelta(hours=3)).isoformat()
    assert len(op.get("/api/v1/operator/nodes/gpu-1/samples", {"since": since}).json()) == 4
    assert len(op.get("/api/v1/operator/nodes/gpu-1/samples", {"since": "6h"}).json()) == 4  # a span, as usage takes
    assert len(op.get("/api/v1/operator/nodes/gpu-1/samples", {"since": "10m"}).json()) == 3
    bad = op.get("/api/v1/operator/nodes/gpu-1/samples", {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()["fields"]
    assert old.pk in NodeSample.objects.values_list("pk", flat=True)
    assert op.get("/api/v1/operator/nodes/nope/samples").status_code == 404
    owner, _, _ = make_session_client(role="owner")
    assert owner.get("/api/v1/operator/nodes/gpu-1/samples").status_code == 403


def test_nodes_list_shows_slots_used_preemptions_and_recent_failures(op: APIClient, node: Node,
                                                                     make_client: Any) -> None:
    node_heartbeat(node=node, state=_state(0.4, 7, gpu=2, cpu=3))
    assert op.get("/api/v1/operator/nodes").json()["results"][0]["failed_requests_5m"] == 0  # none is 0, not null
    _, tenant, _ = make_client()
    for status in (200, 503, 502, 400, 429, 499):  # a caller's own 4xx is not the node failing
        UsageRecord.objects.create(tenant=tenant, node=node, model_name="x", endpoint="completions",
                                   status_code=status, latency_ms=1.0)
    UsageRecord.objects.create(tenant=tenant, node=node, model_name="x", endpoint="completions", status_code=500,
                               latency_ms=1.0, created_at=timezone.now() - timedelta(minutes=6))
    [row] = op.get("/api/v1/operator/nodes").json()["results"]
    assert (row["gpu_used"], row["cpu_used"], row["num_preemptions_total"], row["failed_requests_5m"]) == (2, 5, 7.0, 2)


def _records(tenant: Any, name: str, latencies: list[float], *, status: int = 200, ttft: float | None = None,
             at: Any = None) -> AdapterVersion:
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256=name.ljust(64, "0"),
                                            size_bytes=1, s3_prefix="x/", files=[], status="ready")
    for i, latency in enumerate(latencies):
        UsageRecord.objects.create(tenant=tenant, adapter_version=version, model_name=name, version_number=1,
                                   endpoint="completions", status_code=status if i == 0 else 200, prompt_tokens=2,
                                   completion_tokens=3, latency_ms=latency, ttft_ms=ttft,
                                   created_at=at or timezone.now() - timedelta(minutes=i % 3))
    return version


def test_tenant_traffic_table_has_percentiles_sparkline_and_only_its_own_rows(make_client: Any, base_model: Any) -> None:
    client, tenant, _ = make_client()
    _, other, _ = make_client()
    latencies = [float(x) for x in range(10, 110, 10)]
    _records(tenant, "bot", latencies, status=429, ttft=5.0)
    _records(other, "secret", [1.0, 2.0])
    [row] = client.get("/api/v1/usage/traffic").json()
    assert (row["tenant"], row["model"], row["version"]) == (tenant.slug, "bot", 1)
    assert (row["requests"], row["failures"], row["prompt_tokens"], row["completion_tokens"]) == (10, 1, 20, 30)
    assert row["latency_ms_p50"] == percentile(latencies, 0.5) == 55.0
    assert row["latency_ms_p95"] == round(percentile(latencies, 0.95) or 0, 1) == 95.5
    assert row["ttft_ms_p50"] == 5.0
    assert len(row["spark"]) == 61 and sum(row["spark"]) == 10 and row["spark"][-1] > 0
    assert row["requests_per_s"] == pytest.approx(10 / 3600, rel=1e-3)  # 4 significant digits, not 4 decimals
    bad = client.get("/api/v1/usage/traffic", {"since": timezone.now().isoformat(),
                                                "until": (timezone.now() - timedelta(hours=1)).isoformat()})
    assert bad.status_code == 400 and "until" in bad.json()["fields"]
    wide = client.get("/api/v1/usage/traffic", {"since": (timezone.now() - timedelta(days=3)).isoformat(),
                                                 "bucket": "minute"})
    assert wide.status_code == 400 and "bucket" in wide.json()["fields"]
    day = client.get("/api/v1/usage/traffic", {"since": (timezone.now() - timedelta(days=1)).isoformat()}).json()
    assert len(day[0]["spark"]) in (24, 25)  # hour buckets past 6 h


def test_operators_see_every_tenant_and_filter(op: APIClient, make_client: Any, make_session_client: Any,
                                               base_model: Any) -> None:
    _, a, _ = make_client()
    _, b, _ = make_client()
    _records(a, "one", [1.0, 2.0, 3.0])
    _records(b, "two", [4.0])
    rows = op.get("/api/v1/operator/traffic").json()["results"]
    assert [(r["tenant"], r["model"], r["requests"]) for r in rows] == [(a.slug, "one", 3), (b.slug, "two", 1)]
    assert [r["model"] for r in op.get("/api/v1/operator/traffic", {"tenant": b.slug}).json()["results"]] == ["two"]
    owner, _, _ = make_session_client()
    assert owner.get("/api/v1/operator/traffic").status_code == 403


def test_operator_edits_limits_audited_and_tenants_cannot(op: APIClient, make_session_client: Any,
                                                          make_client: Any) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    listed = {t["slug"]: t for t in op.get("/api/v1/operator/tenants").json()}
    assert listed[tenant.slug]["limits"] == {"rpm_limit": None, "tpm_limit": None, "concurrency_limit": None,
                                             "max_tokens_limit": None, "priority_class": None}
    assert listed[tenant.slug]["residency_quota"] == {"max_pinned": None, "max_gpu_bytes": None}
    answer = op.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {"rpm_limit": 2, "max_tokens_limit": 64},
                      format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["limits"]["rpm_limit"] == 2 and answer.json()["limits"]["max_tokens_limit"] == 64
    tenant.refresh_from_db()
    assert (tenant.rpm_limit, tenant.max_tokens_limit, tenant.tpm_limit) == (2, 64, None)
    [audit] = FleetAuditRecord.objects.all()
    assert (audit.actor, audit.action, audit.target) == ("ops-ida", "set_limits", tenant.slug)
    assert audit.before["rpm_limit"] is None and audit.after["rpm_limit"] == 2
    op.put(f"/api/v1/operator/residency-quotas/{tenant.slug}", {"max_pinned": 1, "max_gpu_bytes": None},
           format="json")
    assert op.get(f"/api/v1/operator/tenants/{tenant.slug}").json()["residency_quota"]["max_pinned"] == 1
    zero = op.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {"rpm_limit": 0}, format="json")
    assert zero.status_code == 400 and "rpm_limit" in zero.json()["fields"]
    extra = op.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {"name": "x"}, format="json")
    assert extra.status_code == 400 and "name" in extra.json()["fields"]
    assert op.patch("/api/v1/operator/tenants/nope/limits", {"rpm_limit": 1}, format="json").status_code == 404
    key_client, _, _ = make_client()
    for client, status in ((owner, 403), (key_client, 403), (APIClient(), 401)):
        assert client.get("/api/v1/operator/tenants").status_code == status
        assert client.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {"rpm_limit": 100},
                            format="json").status_code == status
    tenant.refresh_from_db()
    assert tenant.rpm_limit == 2 and FleetAuditRecord.objects.count() == 2  # the limits edit and the quota edit


def test_operator_reads_a_tenants_limits_in_the_shape_patch_takes(op: APIClient, make_session_client: Any,
                                                                  make_client: Any) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    _, other, _ = make_session_client(role="viewer")
    url = f"/api/v1/operator/tenants/{tenant.slug}/limits"
    assert op.get(url).json() == {"rpm_limit": None, "tpm_limit": None, "concurrency_limit": None,
                                  "max_tokens_limit": None, "priority_class": None}
    op.patch(url, {"rpm_limit": 7, "priority_class": "high"}, format="json")
    read = op.get(url)
    assert read.status_code == 200
    assert read.json() == {"rpm_limit": 7, "tpm_limit": None, "concurrency_limit": None, "max_tokens_limit": None,
                           "priority_class": "high"}
    # What GET gives, PATCH takes back unchanged (every field, nulls included).
    assert op.patch(url, read.json(), format="json").json()["limits"] == read.json()
    missing = op.get("/api/v1/operator/tenants/nope/limits")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    # Operators only; the answer is the same for the caller's own tenant, another one and an unknown slug, so it
    # says nothing about which tenants exist.
    key_client, _, _ = make_client()
    for client, status in ((owner, 403), (key_client, 403), (APIClient(), 401)):
        for slug in (tenant.slug, other.slug, "nope"):
            answer = client.get(f"/api/v1/operator/tenants/{slug}/limits")
            assert answer.status_code == status, (slug, answer.content)
    schema = op.get("/api/v1/schema", {"format": "json"}).json()
    get = schema["paths"]["/api/v1/operator/tenants/{slug}/limits"]["get"]
    assert get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/LimitsOutput")
