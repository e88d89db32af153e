"""Requests the gateway refuses itself are metered once the caller's tenant is known (a fresh user's finding: a
throttled tenant saw 0 errors, since only requests that reached an engine were recorded), within a per-tenant
budget so a flood of refusals cannot flood the usage table; an unknown key's 401 is not (no tenant to bill)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway import usage_sink
from inference.gateway.app import GatewayApp
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_records_write, usage_row
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def _post(app: GatewayApp, calls: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Each ``(key, body)`` posted in order, in one event loop (the app keeps one usage sink per loop)."""
    async def go() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            return [(await http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                     ).status_code for key, body in calls]
    return async_to_sync(go)()


def test_refusals_of_a_known_tenant_are_metered_with_their_status_and_no_tokens(base_model: Any) -> None:
    tenant = TenantFactory()
    limits_set(tenant, limits={"tpm_limit": 50})
    _, key = api_key_create(tenant, name="app")
    app = GatewayApp(background=False)
    statuses = _post(app, [
        (key, {"model": "nope", "prompt": "x"}),  # 404
        (key, {"model": "tiny-llama", "prompt": "x", "temperature": -1}),  # 400
        (key, {"model": "tiny-llama", "prompt": "x", "max_tokens": 1000}),  # 429: larger than the TPM limit
        (key, {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}),  # admitted, no node: 503
        ("qv_nokey.secret", {"model": "tiny-llama", "prompt": "x"}),  # 401: no tenant to meter
    ])
    assert statuses == [404, 400, 429, 503, 401]
    rows = list(app.sink._buffer)
    assert [(r["status_code"], r["model_name"], r["tenant_id"]) for r in rows] == [
        (404, "", tenant.pk), (400, "", tenant.pk), (429, "tiny-llama", tenant.pk),
        (503, "tiny-llama", tenant.pk)]
    assert all(r["prompt_tokens"] == r["completion_tokens"] == 0 and r["node_id"] is None for r in rows)
    assert [r["base_model_id"] for r in rows] == [None, None, base_model.pk, base_model.pk]
    usage_records_write(rows)  # the rows the drain writes: they count among the tenant's errors
    assert sorted(UsageRecord.objects.filter(tenant=tenant).values_list("status_code", flat=True)) == [
        400, 404, 429, 503]


def test_a_flood_of_refusals_is_metered_up_to_the_tenants_budget(base_model: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_sink, "REFUSAL_ROWS_BURST", 5.0)
    monkeypatch.setattr(usage_sink, "REFUSAL_ROWS_PER_S", 0.001)
    first, second = TenantFactory(), TenantFactory()
    app = GatewayApp(background=False)
    keys = [api_key_create(tenant, name="app")[1] for tenant in (first, second)]
    assert _post(app, [(key, {"model": "nope", "prompt": "x"}) for key in keys for _ in range(12)]) == [404] * 24
    rows = list(app.sink._buffer)
    assert [r["tenant_id"] for r in rows] == [first.pk] * 5 + [second.pk] * 5  # one tenant's flood spends its own
    assert app.sink.refusals_unrecorded == 14


def test_a_refusal_for_a_long_model_name_does_not_poison_the_usage_stream(base_model: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack round: ``model`` may be 256 characters but ``UsageRecord.model_name`` holds 200, so the 404's row made
    PostgreSQL refuse the whole drain batch (``value too long``): every tenant's usage stayed in the stream, retried
    and refused for ever, whoever sent it. The name is now clipped, and any other row the database refuses is dropped
    alone."""
    import json
    import uuid

    import redis
    from django.conf import settings

    from inference.metering.usage import usage_drain

    attacker, victim = TenantFactory(), TenantFactory()
    app = GatewayApp(background=False)
    key = api_key_create(attacker, name="app")[1]
    long_name = "m" * 256
    assert _post(app, [(key, {"model": long_name, "prompt": "x"})]) == [404]
    refusal = list(app.sink._buffer)[0]
    billed = usage_row(tenant_id=victim.pk, api_key_id=0, adapter_version_id=None, base_model_id=base_model.pk,
                       node_id=None, model_name="tiny-llama", version_number=None, endpoint="completions",
                       stream=False, status_code=200, usage={"prompt_tokens": 3, "completion_tokens": 9},
                       latency_ms=1.0, ttft_ms=None, created_at=time.time())
    client = redis.Redis.from_url(settings.QUIVER_GATEWAY_REDIS_URL)
    stream = f"quiver:usage:test:{uuid.uuid4().hex}"
    monkeypatch.setattr(settings, "QUIVER_USAGE_STREAM", stream)
    try:
        refused = {**billed, "request_id": uuid.uuid4().hex, "version_number": -1}  # a row PostgreSQL refuses
        for row in (refusal, refused, billed):
            client.xadd(stream, {"r": json.dumps(row)})
        assert usage_drain() == 3  # offered; the refused one alone is dropped (logged)
        assert client.xlen(stream) == 0
    finally:
        client.delete(stream)
    assert list(UsageRecord.objects.filter(tenant=victim).values_list("completion_tokens", flat=True)) == [9]
    stored = UsageRecord.objects.get(tenant=attacker)
    assert (stored.status_code, stored.model_name) == (404, "")  # a name no model has is not stored
    clipped = usage_row(tenant_id=attacker.pk, api_key_id=0, adapter_version_id=None, base_model_id=None, node_id=None,
                        model_name=long_name, version_number=None, endpoint="completions", stream=False,
                        status_code=404, usage=None, latency_ms=1.0, ttft_ms=None, created_at=time.time())
    usage_records_write([clipped])  # any row's name is clipped to the column as it is written
    assert UsageRecord.objects.get(request_id=clipped["request_id"]).model_name == long_name[:200]
