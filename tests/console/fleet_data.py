"""Fleet rows for browser journeys that need full operator pages without engines: two nodes with an hour of
samples, placements in every tier, and an hour of metered traffic (the pages read only these tables)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.fleet.models import Node, NodeSample, Placement
from inference.metering.models import UsageRecord
from tenants.models import Tenant


def seed_fleet(tenant: Tenant, base_model: Any) -> list[AdapterVersion]:
    """Adapters ``capitals`` and ``sums`` of ``tenant`` placed on nodes ``gpu-1`` and ``gpu-2``; returns the versions."""
    now = timezone.now()
    versions = []
    for i, name in enumerate(("capitals", "sums")):
        adapter = adapter_create(tenant, name=name, base_model_name=base_model.base_model_name)
        versions.append(AdapterVersion.objects.create(
            tenant=tenant, adapter=adapter, number=1, sha256=str(i) * 64, size_bytes=(i + 1) * 3 * 1024 * 1024,
            s3_prefix=f"{name}/", files=[], status="ready"))
    for j, name in enumerate(("gpu-1", "gpu-2")):
        node = Node.objects.create(name=name, base_model=base_model, agent_url="http://127.0.0.1:9",
                                   engine_url="http://127.0.0.1:9", healthy=True, last_heartbeat_at=now, max_loras=4,
                                   max_cpu_loras=8, max_lora_rank=16, kv_cache_usage_perc=0.35 + 0.3 * j,
                                   num_requests_running=3, num_requests_waiting=j,
                                   state={"num_preemptions_total": 4.0 * j,
                                          "residency": {"gpu": 1, "cpu": 1 - j}})
        NodeSample.objects.bulk_create([
            NodeSample(node=node, t=now - timedelta(seconds=30 * k), healthy=True,
                       kv_cache_usage_perc=min(1.0, 0.2 + 0.3 * j + 0.25 * ((k % 20) / 20)),
                       num_requests_running=k % 5, num_requests_waiting=(k % 7) // 3,
                       num_preemptions_total=float(j * k // 10), gpu_used=1, cpu_used=2 - j)
            for k in range(120)])
        Placement.objects.create(node=node, adapter_version=versions[0], tier="hot" if j == 0 else "warm",
                                 served=True, pinned=j == 0, load_ms=21.0)
        Placement.objects.create(node=node, adapter_version=versions[1], tier="staged" if j == 0 else "hot",
                                 served=j == 1, load_ms=18.0)
    for k in range(90):
        version = versions[k % 2]
        UsageRecord.objects.create(
            tenant=tenant, adapter_version=version, base_model=base_model, model_name=version.adapter.name,
            version_number=1, endpoint="chat/completions", status_code=500 if k % 29 == 0 else 200,
            prompt_tokens=20, completion_tokens=8 + k % 5, latency_ms=40.0 + (k * 7) % 60, ttft_ms=12.0 + k % 9,
            created_at=now - timedelta(seconds=40 * k))
    return versions
