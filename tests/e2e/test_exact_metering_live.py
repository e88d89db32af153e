"""No token served uncounted, on a real vLLM engine behind a real gateway process: a request with several choices or
several prompts, streamed and cut anywhere, is billed within one token per choice of what the engine generated (its
own ``vllm:generation_tokens_total``); a non-streamed request whose client walked away is billed what the engine
ran; a tokens-per-minute limit holds against prompts that tokenize densely, in parallel, with disconnects."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.utils import timezone

from inference.gateway.limits import CHAT_TEMPLATE_ROOM
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory
from tests.fixtures.stack import GatewayProcess

pytestmark = pytest.mark.django_db(transaction=True)
GENERATED = re.compile(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


def _generated(engine_url: str) -> float:
    """The engine's count of tokens generated since it started (every model, every request, aborted ones too)."""
    return sum(float(v) for v in GENERATED.findall(httpx.get(f"{engine_url}/metrics", timeout=10).text))


def _settled(engine_url: str, since: float) -> float:
    """Tokens the engine generated since ``since``, once its counter stops moving (the engine logs its steps'
    stats after them)."""
    last, steady = _generated(engine_url), 0
    deadline = time.monotonic() + 30
    while steady < 3:
        assert time.monotonic() < deadline, "the engine's token counter never settled"
        time.sleep(0.2)
        now = _generated(engine_url)
        steady = steady + 1 if now == last else 0
        last = now
    return last - since


def _billed(tenant: Any, count: int) -> list[UsageRecord]:
    """The tenant's usage rows of the test's requests that reached the engine (after ``tenant.since``; the gateway's
    own refusals, metered with no node, are not), once ``count`` of them are in."""
    deadline = time.monotonic() + 30
    while len(rows := list(UsageRecord.objects.filter(tenant=tenant, created_at__gte=tenant.since, node__isnull=False)
                           .order_by("created_at"))) < count:
        assert time.monotonic() < deadline, f"{len(rows)} of {count} requests metered"
        usage_drain()
        time.sleep(0.1)
    return rows


def _key(gw: GatewayProcess, **limits: int) -> tuple[Any, str]:
    tenant = TenantFactory()
    key, plaintext = api_key_create(tenant, name="app")
    if limits:
        limits_set(tenant, limits=limits)
    deadline = time.monotonic() + 30
    while True:  # the process sees the node (and the limits: a request under them gets the headers)
        resp = httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {plaintext}"}, timeout=60,
                          json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1})
        if resp.status_code == 200 and (not limits or "x-ratelimit-limit-tokens" in resp.headers):
            break
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.2)
    tenant.since = timezone.now()  # the warm-up requests' rows, metered later, are not the test's
    return tenant, plaintext


def _cut_stream(gw: GatewayProcess, key: str, body: dict[str, Any], after_chunks: int,
                endpoint: str = "completions") -> int:
    """Stream ``body`` and close the connection after ``after_chunks`` data lines; returns the lines read."""
    read = 0
    with httpx.stream("POST", f"{gw.url}/v1/{endpoint}", headers={"Authorization": f"Bearer {key}"},
                      json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data:"):
                read += 1
                if read >= after_chunks:
                    break
    return read


@pytest.mark.parametrize("shape", ["n8", "eight_prompts", "chat_n8"])
def test_streams_with_many_choices_cut_anywhere_are_billed_what_the_engine_generated(
        live_node, gateway_processes: list[GatewayProcess], shape: str) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_processes[0]
    tenant, key = _key(gw)
    body: dict[str, Any] = {"model": "tiny-llama", "max_tokens": 120, "ignore_eos": True, "stream": True,
                            "temperature": 1.0, "seed": 7}
    endpoint = "chat/completions" if shape == "chat_n8" else "completions"
    if shape == "n8":
        body.update(prompt="the cat sat on", n=8)
    elif shape == "chat_n8":
        body.update(messages=[{"role": "user", "content": "the cat sat on"}], n=8)
    else:
        body.update(prompt=[f"prompt number {i} says" for i in range(8)])
    rng = random.Random(5)
    cuts = [rng.randint(1, 40), rng.randint(100, 400), 10_000]  # early, mid-way, never (read to the end)
    for i, after in enumerate(cuts):
        before = _generated(live_node.engine_url)
        _cut_stream(gw, key, body, after, endpoint)
        generated = _settled(live_node.engine_url, before)
        row = _billed(tenant, i + 1)[-1]
        # A cut is 499, unless the engine had finished and the gateway sent it all before the client left (a fast
        # engine outruns a client reading a few events: the rest waits in socket buffers).
        assert row.status_code == (200 if after == 10_000 or row.completion_tokens == 8 * 120 else 499)
        assert abs(row.completion_tokens - generated) <= 8, (after, row.completion_tokens, generated)
        assert generated > 0 and row.prompt_tokens > 0
        if after == 10_000:
            assert row.completion_tokens == 8 * 120 == generated


def test_a_walked_away_unstreamed_request_is_billed_what_the_engine_ran(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_processes[0]
    tenant, key = _key(gw)
    before = _generated(live_node.engine_url)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=0.3,
                   json={"model": "tiny-llama", "prompt": "the cat", "max_tokens": 480, "ignore_eos": True, "n": 2})
    generated = _settled(live_node.engine_url, before)
    row = _billed(tenant, 1)[0]
    assert (row.status_code, row.stream) == (499, False)
    assert generated > 0 and abs(row.completion_tokens - generated) <= 2, (row.completion_tokens, generated)
    assert row.prompt_tokens > 0


def test_a_tpm_limit_holds_against_dense_prompts_in_parallel_and_cut_streams(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """``"~" * 500`` is 501 tokens for this tokenizer, not the 126 that 4 characters a token would make it: counted
    by the engine's tokenizer, one such request fits a 1,000-token minute and a second does not."""
    gw = gateway_processes[0]
    tenant, key = _key(gw, tpm_limit=1000)
    while time.time() % 60 > 40:  # the whole test inside one fixed minute window (the limit's unit)
        time.sleep(0.5)
    headers = {"Authorization": f"Bearer {key}"}
    dense = {"model": "tiny-llama", "prompt": "~" * 500, "max_tokens": 16, "ignore_eos": True}
    statuses: list[int] = []

    def send(i: int) -> None:
        if i % 2:
            try:  # a stream cut after its first chunk: its prompt and what was generated still count
                statuses.append(200 if _cut_stream(gw, key, {**dense, "stream": True}, 1) else 0)
            except AssertionError:
                statuses.append(429)
            return
        statuses.append(httpx.post(f"{gw.url}/v1/completions", headers=headers, json=dense, timeout=120).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(429) >= 6, statuses
    served = _billed(tenant, statuses.count(200))
    total = sum(r.prompt_tokens + r.completion_tokens for r in served)
    assert all(r.prompt_tokens >= 501 for r in served), [r.prompt_tokens for r in served]
    assert total <= 1000 + 517, total  # one request's overshoot at most
    # The 429s are metered too (no node, no tokens): the tenant sees them among its errors.
    refused = UsageRecord.objects.filter(tenant=tenant, created_at__gte=tenant.since, node__isnull=True)
    deadline = time.monotonic() + 30
    while refused.count() < statuses.count(429):
        assert time.monotonic() < deadline, f"{refused.count()} of {statuses.count(429)} refusals metered"
        usage_drain()
        time.sleep(0.1)
    assert {(r.status_code, r.prompt_tokens, r.completion_tokens) for r in refused} == {(429, 0, 0)}



def _gateway_count(gw: GatewayProcess, live_node: Any, endpoint: str, body: Callable[[Any], dict[str, Any]],
                   probe: Any) -> Callable[[Any], int | None]:
    """``counted(x)``: the prompt token count the gateway's 429 names for ``body(x)`` on ``/v1/<endpoint>`` under a
    fresh tenant's 2-token TPM limit (every request one too large), None without one; returned once the gateway
    counts ``probe`` and has logged its tokenizer loaded (≤ 30 s)."""
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    limits_set(tenant, limits={"tpm_limit": 2})

    def counted(x: Any) -> int | None:
        resp = httpx.post(f"{gw.url}/v1/{endpoint}", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                          json={"model": "tiny-llama", "max_tokens": 1, **body(x)})
        found = re.search(r"the prompt, about (\d+),", resp.text) if resp.status_code == 429 else None
        return int(found.group(1)) if found else None

    loaded = f"gateway.tokenizer_loaded base_model_id={live_node.base_model_id}"
    deadline = time.monotonic() + 30
    while counted(probe) is None or loaded not in gw.child.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, gw.child.tail()
        time.sleep(0.2)
    return counted


def test_the_gateway_counts_a_prompt_with_the_base_models_tokenizer_as_the_engine_does(
        live_node, vllm_engine, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """Under a TPM limit a completion prompt is counted in the gateway process with the tokenizer stored at
    registration (no ``/tokenize`` round trip once it is loaded). Under a limit of 2 tokens every request is one
    too large, and its 429 names the prompt's count: it equals the engine's own ``/tokenize`` count for dense,
    multilingual and special-token text, and the background check against the engine finds no difference."""
    gw = gateway_processes[0]
    counted = _gateway_count(gw, live_node, "completions", lambda prompt: {"prompt": prompt}, "x")
    prompts = ["~" * 500, "the cat sat on the mat", "東京は日本の首都です😀😀", "<s></s><pad> x", " \t\n  lead", "a"]
    for prompt in prompts:
        engine = httpx.post(f"{vllm_engine.url}/tokenize", headers=vllm_engine.headers, timeout=30,
                            json={"model": "tiny-llama", "prompt": prompt}).json()["count"]
        assert counted(prompt) == engine, prompt
    assert "gateway.tokenizer_mismatch" not in gw.child.log.read_text(errors="replace")


def test_the_gateway_counts_a_chat_with_the_base_models_template_as_the_engine_does(
        live_node, vllm_engine, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """A chat of plain text messages is rendered with the chat template stored at registration and counted in the
    gateway: its 429 under a 2-token limit names the same count as the engine's ``/tokenize`` of the messages, no
    mismatch is logged, and a chat the gateway leaves to the engine (content parts) is still counted exactly."""
    gw = gateway_processes[0]
    counted = _gateway_count(gw, live_node, "chat/completions", lambda messages: {"messages": messages},
                             [{"role": "user", "content": "x"}])
    assert "chat_template=True" in gw.child.log.read_text(errors="replace")
    chats: list[list[dict[str, object]]] = [
        [{"role": "user", "content": "~" * 300}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "東京は😀"},
         {"role": "assistant", "content": "<s></s> ok"}, {"role": "user", "content": " \t\n again"}],
        [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "text", "text": "~~~~"}]}],
    ]
    for messages in chats:
        engine = httpx.post(f"{vllm_engine.url}/tokenize", headers=vllm_engine.headers, timeout=30,
                            json={"model": "tiny-llama", "messages": messages}).json()["count"]
        assert counted(messages) == engine, messages
    assert "gateway.tokenizer_mismatch" not in gw.child.log.read_text(errors="replace")


def test_a_chat_whose_template_writes_tools_is_billed_the_engines_count(
        live_node, vllm_engine, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """The suite's model renders a chat's tools as Llama 3.1's template does (``demo.tiny_model.CHAT_TEMPLATE``: a
    system preamble, each tool as indented JSON): far more tokens than the request has bytes. The billing cap was
    those bytes plus 64, so an honest engine's count was cut; it is billed whole now, streamed or not."""
    gw = gateway_processes[0]
    tenant, key = _key(gw)
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
                            "tools": [{"type": "function", "function": {"name": "f"}}]}
    engine = httpx.post(f"{vllm_engine.url}/tokenize", headers=vllm_engine.headers, timeout=30,
                        json={"model": "tiny-llama", **chat}).json()["count"]
    body = {"model": "tiny-llama", "max_tokens": 2, **chat}
    # What the old cap allowed: the body, what the gateway adds before the engine (stream options and the cache salt:
    # 125 bytes), and 64.
    assert engine > len(json.dumps({**body, "stream": True}).encode()) + 130 + CHAT_TEMPLATE_ROOM, engine
    for stream in (False, True):
        resp = httpx.post(f"{gw.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                          json={**body, "stream": stream})
        assert resp.status_code == 200, resp.text
    rows = _billed(tenant, 2)
    assert [(r.prompt_tokens, r.status_code) for r in rows] == [(engine, 200)] * 2
