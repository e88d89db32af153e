"""The whole chain on real components: REST upload → S3 → Celery validation → warm on a real vLLM CPU node through
the node agent → OpenAI-compatible gateway (official ``openai`` client), with per-tenant keys and metering.

Runs on PostgreSQL, Redis, SeaweedFS, a real Celery worker, one vLLM engine per session and the node agent.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings

from adapters_app.models import AdapterVersion
from adapters_app.storage import delete_keys, s3_client
from demo.api_client import upload_adapter, wait_validated
from demo.assets import DemoAssets
from demo.tiny_model import load_base
from inference.fleet.models import Placement
from inference.fleet.node_client import node_call
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain
from tenants.services import api_key_create, api_key_revoke
from tests.factories import TenantFactory
from tests.fixtures.reference import greedy_ids

pytestmark = pytest.mark.django_db(transaction=True)


def _hf_greedy_ids(base_dir: Path, prompt: str, n: int) -> list[int]:
    model, tok = load_base(base_dir)
    return greedy_ids(model.eval(), tok, prompt, n)


def _stream_chat(client: openai.OpenAI, model: str, content: str) -> str:
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                            max_tokens=12, temperature=0, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_upload_validate_warm_and_serve_two_adapters_and_the_base(
    demo_assets: DemoAssets, base_model, gateway_server: str, celery_worker: None, live_node  # type: ignore[no-untyped-def]
) -> None:
    tenant = TenantFactory(slug="acme")
    _, key = api_key_create(tenant, name="app")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    names = ["capitals", "sums"]
    for name in names:
        number = upload_adapter(api, name, demo_assets.adapters[name], base_model="tiny-llama")["number"]
        assert wait_validated(api, name, number, timeout=120)["status"] == "ready"

    client = openai.OpenAI(base_url=gateway_server + "/v1", api_key=key, max_retries=0, timeout=180)
    assert {"capitals", "sums", "tiny-llama"} <= {m.id for m in client.models.list().data}

    # Non-streaming completion on one adapter (a cold start: the gateway waits for the warm).
    first = demo_assets.examples["capitals"][0]
    out = client.completions.create(model="capitals", prompt=first["prompt"], max_tokens=12, temperature=0)
    assert out.model == "capitals"
    assert out.choices[0].text.strip() == first["completion"].strip()

    # Streaming chat on two adapters concurrently plus a base-model request, in one engine batch.
    cap, add = demo_assets.examples["capitals"][1], demo_assets.examples["sums"][0]
    base_prompt = cap["prompt"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        f_cap = pool.submit(_stream_chat, client, "capitals", cap["prompt"])
        f_add = pool.submit(_stream_chat, client, "sums", add["prompt"])
        f_base = pool.submit(client.completions.create, model="tiny-llama", prompt=base_prompt, max_tokens=8,
                             temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
        assert f_cap.result().strip() == cap["completion"].strip()
        assert f_add.result().strip() == add["completion"].strip()
        base_out = f_base.result()
    assert base_out.choices[0].model_extra["token_ids"] == _hf_greedy_ids(demo_assets.base_dir, base_prompt, 8)

    # Residency and metering were recorded per version (usage goes through the Redis stream; drain it).
    deadline = time.monotonic() + 10
    while UsageRecord.objects.filter(tenant=tenant).count() < 4:
        assert time.monotonic() < deadline, "usage records never reached the database"
        usage_drain()
        time.sleep(0.1)
    assert Placement.objects.filter(adapter_version__adapter__name__in=names,
                                    tier__in=["warm", "hot"]).count() == 2
    usage = UsageRecord.objects.filter(tenant=tenant, adapter_version__isnull=False, status_code=200)
    assert usage.count() >= 3
    assert all(u.prompt_tokens > 0 and u.completion_tokens > 0 for u in usage)
    assert UsageRecord.objects.filter(tenant=tenant, adapter_version__isnull=True, completion_tokens=8).exists()
    summary = {row["model"]: row for row in api.get("/api/v1/usage").json()}
    assert summary["capitals"]["requests"] == 2 and summary["sums"]["requests"] == 1
    assert summary["tiny-llama"]["completion_tokens"] == 8 and summary["tiny-llama"]["version"] is None

    # Tenant isolation and key revocation on the gateway.
    other = TenantFactory(slug="other")
    _, other_key = api_key_create(other, name="o")
    other_client = openai.OpenAI(base_url=gateway_server + "/v1", api_key=other_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other_client.completions.create(model="capitals", prompt="x", max_tokens=1)
    assert "capitals" not in {m.id for m in other_client.models.list().data}
    assert httpx.get(f"{gateway_server}/api/v1/adapters/capitals",
                     headers={"Authorization": f"Bearer {other_key}"}).status_code == 404
    api_key_revoke(tenant, key_id=key[3:].split(".")[0])
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model="capitals", prompt="x", max_tokens=1)


def test_unknown_model_and_bad_requests_are_openai_shaped(gateway_server: str, base_model) -> None:  # type: ignore[no-untyped-def]
    _, key = api_key_create(TenantFactory(), name="k")
    resp = httpx.post(f"{gateway_server}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "nope", "prompt": "x"})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    resp = httpx.post(f"{gateway_server}/v1/completions", headers={"Authorization": f"Bearer {key}"}, content=b"{")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = httpx.post(f"{gateway_server}/v1/completions", json={"model": "tiny-llama", "prompt": "x"})
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"


def test_failed_warm_is_reported_then_retried(
    demo_assets: DemoAssets, base_model, gateway_server: str, celery_worker: None, node_agent, live_node  # type: ignore[no-untyped-def]
) -> None:
    tenant = TenantFactory(slug="flaky")
    _, key = api_key_create(tenant, name="app")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    number = upload_adapter(api, "upper", demo_assets.adapters["upper"], base_model="tiny-llama")["number"]
    assert wait_validated(api, "upper", number, timeout=120)["status"] == "ready"
    version = AdapterVersion.objects.get(adapter__tenant=tenant, adapter__name="upper")
    deadline = time.monotonic() + 60
    while not Placement.objects.filter(adapter_version=version, tier__in=["warm", "hot"]).exists():
        assert time.monotonic() < deadline, "the warm after validation never finished"
        time.sleep(0.2)
    # Take it off the node (engine and disk) and out of S3, so the next warm must fail.
    node_call(live_node, "/v1/adapters/unload", {"lora_name": version.served_name})
    shutil.rmtree(node_agent.cache_dir / version.served_name)
    Placement.objects.filter(adapter_version=version).delete()
    bucket = settings.AWS_STORAGE_BUCKET_NAME
    stash = {f["s3_key"]: s3_client().get_object(Bucket=bucket, Key=f["s3_key"])["Body"].read() for f in version.files}
    delete_keys(stash)

    body = {"model": "upper", "prompt": "upper cat:", "max_tokens": 4, "temperature": 0}
    failed = api.post("/v1/completions", json=body)
    assert failed.status_code == 503, failed.text
    assert failed.json()["error"]["code"] == "adapter_load_failed"
    message = failed.json()["error"]["message"]
    assert "s3_object_missing" in message and "tenants/" not in message  # the cause's code, never the S3 key
    assert "tenants/" in Placement.objects.get(adapter_version=version).last_error  # operators keep the detail
    assert Placement.objects.get(adapter_version=version).tier == "errored"

    for s3_key, data in stash.items():
        s3_client().put_object(Bucket=bucket, Key=s3_key, Body=data)
    retried = api.post("/v1/completions", json=body)
    assert retried.status_code == 200, retried.text
    assert retried.json()["choices"][0]["text"] == " CAT"
