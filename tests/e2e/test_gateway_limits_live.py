"""Limits and metering on the real stack: concurrency is shared by two gateway processes; a client that walks away
mid-stream is metered 499 with the tokens it was sent; successful answers carry OpenAI's x-ratelimit-* headers."""

from __future__ import annotations

import time

import httpx
import pytest

from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory
from tests.fixtures.stack import GatewayProcess

pytestmark = pytest.mark.django_db(transaction=True)
LONG = {"model": "tiny-llama", "prompt": "the cat", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
        "stream": True}


def _wait_served(gw: GatewayProcess, key: str) -> None:
    deadline = time.monotonic() + 30
    while httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                     json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1}).status_code != 200:
        assert time.monotonic() < deadline, "the gateway process never saw the node"
        time.sleep(0.2)


def _until_limit(gw: GatewayProcess, key: str, header: str, value: int, *, within: float = 1.0) -> None:
    """Poll ``gw`` until its answers carry ``header`` = ``value`` (a limit just set reached the process by cache
    invalidation), then assert the promise: the last answer without it was sent within ``within`` seconds (an
    answer sent later must carry it; a slow answer on a busy box does not count against the promise)."""
    t0 = time.monotonic()
    last_stale = t0
    while True:
        sent = time.monotonic()
        answer = httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                            json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1})
        if answer.headers.get(header) == str(value):
            break
        last_stale = sent
        assert time.monotonic() - t0 < 30, f"{header} never became {value}"
    assert last_stale - t0 < within, f"an answer sent {last_stale - t0:.2f} s after the change still had the old limit"


def test_concurrency_limit_is_shared_by_two_gateway_processes(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    key, plaintext = api_key_create(tenant, name="app")
    for gw in gateway_processes:
        _wait_served(gw, plaintext)
    limits_set(key, limits={"concurrency_limit": 2, "rpm_limit": 1000})
    for gw in gateway_processes:  # one write: the concurrency limit arrives with the rpm limit's header
        _until_limit(gw, plaintext, "x-ratelimit-limit-requests", 1000)
    headers = {"Authorization": f"Bearer {plaintext}"}
    a = httpx.Client(base_url=gateway_processes[0].url, headers=headers, timeout=120)
    b = httpx.Client(base_url=gateway_processes[1].url, headers=headers, timeout=120)
    with a.stream("POST", "/v1/completions", json=LONG) as first, b.stream("POST", "/v1/completions", json=LONG) as second:
        assert first.status_code == 200 and second.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "1000"
        # Both are in flight now (400 tokens take the engine far longer than this next call).
        third = b.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 1})
        assert third.status_code == 429, third.text
        assert "Concurrency limit" in third.json()["error"]["message"] and third.headers["retry-after"] == "1"
        for resp in (first, second):
            for _ in resp.iter_lines():
                pass
    deadline = time.monotonic() + 10
    while a.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 1}).status_code != 200:
        assert time.monotonic() < deadline, "the leases were never released"
        time.sleep(0.2)


def test_a_client_that_walks_away_is_metered_499_with_the_tokens_sent(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    _, plaintext = api_key_create(tenant, name="app")
    gw = gateway_processes[0]
    _wait_served(gw, plaintext)
    received = 0
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {plaintext}"}, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=LONG) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    received += 1
                if received == 5:
                    break  # close the connection mid-stream
    records = UsageRecord.objects.filter(tenant=tenant, stream=True)
    deadline = time.monotonic() + 20
    while not records.exists():
        assert time.monotonic() < deadline, "the cut stream was never metered"
        usage_drain()
        time.sleep(0.2)
    record = records.get()
    assert record.status_code == 499
    assert record.prompt_tokens > 0
    assert 5 <= record.completion_tokens < LONG["max_tokens"]


def test_a_non_streaming_client_that_walks_away_frees_its_slot_and_is_metered_499(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """Without a stream the answer comes at the end; a client gone before it must not keep the engine generating and
    its concurrency slot held (attack: 480 tokens generated for nobody, billed 200, the tenant 429'd meanwhile)."""
    tenant = TenantFactory()
    key, plaintext = api_key_create(tenant, name="app")
    gw = gateway_processes[0]
    _wait_served(gw, plaintext)
    limits_set(key, limits={"concurrency_limit": 1, "rpm_limit": 1000})
    _until_limit(gw, plaintext, "x-ratelimit-limit-requests", 1000)  # the rpm header marks the write's arrival
    headers = {"Authorization": f"Bearer {plaintext}"}
    # 500 tokens (the test engine's context is 512) take over a second even on a fast machine; the client leaves
    # after 0.3 s, once the gateway has sent the request on.
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{gw.url}/v1/completions", headers=headers, timeout=0.3,
                   json={**LONG, "stream": False, "max_tokens": 500})
    left = time.monotonic()
    while (resp := httpx.post(f"{gw.url}/v1/completions", headers=headers, timeout=60,
                              json={**LONG, "stream": False, "max_tokens": 1})).status_code != 200:
        assert resp.status_code == 429, resp.text
        assert time.monotonic() - left < 3.0, "the slot stayed held while the engine generated for nobody"
        time.sleep(0.1)
    records = UsageRecord.objects.filter(tenant=tenant, status_code=499)
    deadline = time.monotonic() + 20
    while not records.exists():
        assert time.monotonic() < deadline, "the walked-away request was never metered"
        usage_drain()
        time.sleep(0.2)
    assert records.get().stream is False


def test_under_a_tpm_limit_a_chat_without_max_tokens_generates_no_more_than_it_reserved(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """The reservation (prompt + 256 for a chat without max_tokens) must bound the tokens: vLLM alone runs to the
    end of the context (attack: two such chats billed 509 tokens each against a 600 TPM limit)."""
    tenant = TenantFactory()
    key, plaintext = api_key_create(tenant, name="app")
    gw = gateway_processes[0]
    _wait_served(gw, plaintext)
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    headers = {"Authorization": f"Bearer {plaintext}"}
    free = httpx.post(f"{gw.url}/v1/chat/completions", headers=headers, timeout=120, json=chat)
    assert free.status_code == 200 and free.json()["usage"]["completion_tokens"] > 256  # no limit: as vLLM does
    limits_set(key, limits={"tpm_limit": 5000})
    _until_limit(gw, plaintext, "x-ratelimit-limit-tokens", 5000)
    capped = httpx.post(f"{gw.url}/v1/chat/completions", headers=headers, timeout=120, json=chat)
    assert capped.status_code == 200, capped.text
    assert capped.json()["usage"]["completion_tokens"] <= 256
