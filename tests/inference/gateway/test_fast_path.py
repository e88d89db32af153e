"""The fast path's caches across processes: a revoked key or a deleted adapter stops working within 1 s on every
gateway process (Redis invalidation); usage moves from the Redis stream to PostgreSQL exactly once."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
import redis
from django.conf import settings

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create, adapter_delete
from inference.metering import usage as metering
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain, usage_row
from tenants.services import api_key_create, api_key_revoke, limits_set
from tests.factories import TenantFactory
from tests.fixtures.stack import GatewayProcess


def _post(gw: GatewayProcess, key: str, model: str) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "prompt": "x", "max_tokens": 1}, timeout=10)


def _until(gateways: list[GatewayProcess], key: str, model: str, status: int, within: float) -> float:
    """Poll every gateway until each answers ``status``, then assert the promise: the last answer that was not
    ``status`` was sent less than ``within`` seconds after the call (any request sent later must be refused; a
    slow answer on a loaded machine does not count against the promise). Returns that last stale send time."""
    t0 = time.monotonic()
    last_stale = 0.0
    pending = set(range(len(gateways)))
    while pending:
        still = set()
        for i in pending:
            sent = time.monotonic() - t0
            if _post(gateways[i], key, model).status_code != status:
                still.add(i)
                last_stale = max(last_stale, sent)
        pending = still
        assert time.monotonic() - t0 < 30, f"gateways {sorted(pending)} never answered {status}"
    assert last_stale < within, f"a request sent {last_stale:.2f} s after the change was still let through"
    return last_stale


@pytest.mark.django_db(transaction=True)
def test_revocation_and_deletion_reach_every_gateway_process_within_1s(
        base_model, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    key, plaintext = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    # Both processes cache the key and the target: no node serves the base model here, so 503 (auth passed).
    for gw in gateway_processes:
        for _ in range(3):
            assert _post(gw, plaintext, "bot").status_code == 503
    adapter_delete(tenant, adapter=adapter)
    _until(gateway_processes, plaintext, "bot", 404, within=1.0)
    api_key_revoke(tenant, key_id=key.key_id)
    _until(gateway_processes, plaintext, "bot", 401, within=1.0)


def _row(tenant_id: int, tokens: int) -> dict[str, object]:
    return usage_row(tenant_id=tenant_id, api_key_id=0, adapter_version_id=None, base_model_id=None, node_id=None,
                     model_name="tiny-llama", version_number=None, endpoint="completions", stream=True,
                     status_code=200, usage={"prompt_tokens": 3, "completion_tokens": tokens}, latency_ms=1.0,
                     ttft_ms=0.5, created_at=time.time() - 60)


@pytest.mark.django_db
def test_usage_drain_writes_each_record_once_and_reclaims_a_dead_consumers_entries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis.from_url(settings.QUIVER_GATEWAY_REDIS_URL)
    stream = f"quiver:usage:test:{uuid.uuid4().hex}"
    monkeypatch.setattr(settings, "QUIVER_USAGE_STREAM", stream)
    tenant = TenantFactory()
    first = _row(tenant.pk, 5)
    client.xadd(stream, {"r": json.dumps(first)})
    client.xadd(stream, {"r": json.dumps(first)})  # redelivered: same request_id
    assert usage_drain() == 2
    records = UsageRecord.objects.filter(tenant=tenant)
    assert records.count() == 1
    record = records.get()
    assert (record.completion_tokens, record.api_key_id, record.ttft_ms) == (5, None, 0.5)
    assert record.created_at.timestamp() == pytest.approx(first["created_at"], abs=0.01)  # arrival, not write time
    # A consumer that read an entry and died before writing it: the next drain takes it over.
    client.xadd(stream, {"r": json.dumps(_row(tenant.pk, 7))})
    assert client.xreadgroup(settings.QUIVER_USAGE_GROUP, "dead-consumer", {stream: ">"}, count=10)
    assert usage_drain() == 0  # not idle long enough yet
    monkeypatch.setattr(metering, "RECLAIM_IDLE_MS", 0)
    assert usage_drain() == 1
    assert sorted(records.values_list("completion_tokens", flat=True)) == [5, 7]
    assert client.xlen(stream) == 0
    client.delete(stream)


@pytest.mark.django_db(transaction=True)
def test_rpm_and_tpm_limits_hold_across_two_gateway_processes(
        base_model, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    limits_set(tenant, limits={"rpm_limit": 5})
    key, plaintext = api_key_create(tenant, name="app")
    # Admitted requests find no node (503); refused ones are 429. Alternate between the processes, inside one
    # fixed one-minute window.
    while time.time() % 60 > 45:
        time.sleep(0.5)
    answers = [_post(gateway_processes[i % 2], plaintext, "tiny-llama") for i in range(14)]
    codes = [a.status_code for a in answers]
    assert codes.count(429) == 9 and codes.count(503) == 5, codes
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"] | {"message": ""} == {"message": "", "type": "requests", "param": None,
                                                         "code": "rate_limit_exceeded"}
    assert "Limit 5" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60 and int(refused.headers["retry-after-ms"]) > 0
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # A key's own limit: tokens per minute, reserved as prompt + max_tokens; one request over the whole limit is
    # refused outright (and told not to retry).
    other = TenantFactory()
    key2, plaintext2 = api_key_create(other, name="app")
    limits_set(key2, limits={"tpm_limit": 100})
    body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1000}
    big = httpx.post(f"{gateway_processes[0].url}/v1/completions", json=body, timeout=10,
                     headers={"Authorization": f"Bearer {plaintext2}"})
    assert big.status_code == 429 and big.headers["x-should-retry"] == "false", big.text
    assert big.json()["error"]["type"] == "tokens" and "Request too large" in big.json()["error"]["message"]
    body["max_tokens"] = 60
    first, second = (httpx.post(f"{gw.url}/v1/completions", json=body, timeout=10,
                                headers={"Authorization": f"Bearer {plaintext2}"}) for gw in gateway_processes)
    # The first is admitted, finds no node and is refunded before its answer is sent (``QuiverGateway.handle``
    # awaits ``settle`` first); the second, sent after that answer through the other process, is then admitted too.
    assert first.status_code == 503, first.text
    assert second.status_code == 503, second.text
