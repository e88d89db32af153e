"""Hostile inputs at the gateway's front (found by attacking the demo stack): each is a 4xx, never a 500.

- a JSON ``\\ud800`` escape (an unpaired surrogate) in any field: a str that cannot be encoded as UTF-8, which failed
  as a 500 in the database query for ``model`` and in the token estimate for ``prompt``/``messages``;
- a non-ASCII key secret behind a real key id: ``hmac.compare_digest`` raises on non-ASCII str once the key's
  secret is cached (a 500 for anyone who saw a key id).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from inference.gateway import hygiene
from inference.gateway.app import GatewayApp
from inference.gateway.errors import GatewayError
from inference.gateway.prompt_counts import Counted
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "\\ud800", "prompt": "x"}', "model"),
    (b'{"model": "m", "prompt": "\\u0000\\uDBFF"}', "prompt"),
    (b'{"model": "m", "prompt": ["ok", "\\udc00"]}', "prompt"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800x"}]}', "messages"),
    (b'{"model": "m", "prompt": "x", "stop": "\\ude00"}', "stop"),
    (b'{"model": "m", "prompt": "x", "\\ud800": 1}', "body"),
])
def test_an_unpaired_surrogate_is_a_400_naming_the_field(raw: bytes, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        GatewayApp._parse(raw)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, "invalid_value")


def test_paired_surrogates_and_plain_unicode_pass() -> None:
    body = GatewayApp._parse('{"model": "m", "prompt": "\\ud83d\\ude00 é 日本"}'.encode())
    assert body["prompt"] == "\U0001f600 é 日本"


@pytest.mark.django_db
def test_a_non_ascii_secret_behind_a_real_key_id_is_a_401(base_model: Any) -> None:
    _, key = api_key_create(TenantFactory(), name="app")
    app = GatewayApp(background=False)

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            for secret in (key, key.split(".")[0] + ".é", key + "é"):  # the first caches the verified secret
                answer = await http.post("/v1/completions", json={"model": "nope", "prompt": "x"},
                                         headers={"Authorization": f"Bearer {secret}".encode()})
                statuses.append(answer.status_code)
                if answer.status_code == 401:
                    assert answer.json()["error"]["code"] == "invalid_api_key"
        return statuses

    assert async_to_sync(go)() == [404, 401, 401]


@pytest.mark.django_db
def test_a_malformed_body_gets_its_400_before_a_too_large_requests_429(base_model: Any) -> None:
    tenant = TenantFactory()
    limits_set(tenant, limits={"tpm_limit": 100})
    _, key = api_key_create(tenant, name="app")
    app = GatewayApp(background=False)

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver",
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            return [await http.post(path, json={"model": "tiny-llama", "max_tokens": 1000, **body}) for path, body in (
                ("/v1/completions", {"prompt": "x", "stop": ""}),
                ("/v1/completions", {"prompt": "x", "min_tokens": 1001}),
                ("/v1/completions", {"prompt": "x"}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                          "max_completion_tokens": 1000}),
            )] + [await http.post("/v1/completions", json={"model": "tiny-llama", "prompt": "x", "min_tokens": 150})]

    stop, min_tokens, big, big_chat, at_least = async_to_sync(go)()
    assert (stop.status_code, stop.json()["error"]["param"]) == (400, "stop"), stop.text
    assert (min_tokens.status_code, min_tokens.json()["error"]["param"]) == (400, "min_tokens"), min_tokens.text
    assert big.status_code == 429 and big.headers["x-should-retry"] == "false" and "retry-after" not in big.headers
    assert "Limit 100" in big.json()["error"]["message"] and "'max_tokens'" in big.json()["error"]["message"]
    assert big_chat.status_code == 429 and "'max_completion_tokens'" in big_chat.json()["error"]["message"]
    # Without max_tokens under a TPM limit the gateway sets it (16 on completions), but never below min_tokens
    # (vLLM refuses min_tokens over max_tokens), and reserves that much, beside the prompt "x": 2 tokens (BOS and x)
    # with the base model's tokenizer once this process has loaded it, its bound before (1 byte + 2; no engine here).
    assert at_least.status_code == 429 and re.search(r"Requested 15[23] \(", at_least.json()["error"]["message"]), \
        at_least.text


@pytest.mark.django_db
def test_a_prompt_hidden_in_tools_or_tool_calls_counts_against_a_tpm_limit(base_model: Any) -> None:
    """The chat template renders ``tools`` and an assistant's ``tool_calls`` into the prompt: a request whose
    ``content`` is one word and whose tool definition is 20 KB is too large for a TPM limit of 1000, not a
    4-token prompt (the engine is never asked: no node serves this test, so an admitted request would be a 503)."""
    tenant = TenantFactory()
    limits_set(tenant, limits={"tpm_limit": 1000})
    _, key = api_key_create(tenant, name="app")
    app = GatewayApp(background=False)
    padding = "lorem ipsum " * 1700  # about 20 KB, 5,000 tokens at 4 characters a token
    tools = [{"type": "function", "function": {"name": "f", "description": padding, "parameters": {}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": padding}}

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver",
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            return [await http.post("/v1/chat/completions", json={"model": "tiny-llama", "max_tokens": 10, **body})
                    for body in ({"messages": [{"role": "user", "content": "hi"}], "tools": tools},
                                 {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]},
                                               {"role": "tool", "content": "ok", "tool_call_id": "c1"}]})]

    for answer in async_to_sync(go)():
        assert answer.status_code == 429 and answer.headers["x-should-retry"] == "false", answer.text
        assert "Limit 1000" in answer.json()["error"]["message"]


@pytest.mark.django_db
def test_a_host_outside_allowed_hosts_is_refused_as_django_refuses_it(base_model: Any) -> None:
    """The completion routes run without Django, and answered any Host while /v1/models (Django) refused it (attack
    round): the same ALLOWED_HOSTS rule, the same code, before the key or the body is read."""
    _, key = api_key_create(TenantFactory(), name="app")
    app = GatewayApp(background=False)

    async def go(base_url: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url) as http:
            return await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "nope", "prompt": "x", "max_tokens": 1})

    refused = async_to_sync(go)("http://evil.example")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "disallowed_host", refused.text
    allowed = async_to_sync(go)("http://testserver")
    assert allowed.status_code == 404 and allowed.json()["error"]["code"] == "model_not_found", allowed.text


@pytest.mark.django_db
def test_a_max_tokens_cap_names_whose_it_is(base_model: Any) -> None:
    """The 400 for ``max_tokens`` over a cap names the party that set it: a tenant-wide cap was blamed on a key that
    had none (a fresh user's finding)."""
    tenant = TenantFactory()
    limits_set(tenant, limits={"max_tokens_limit": 8})
    _, plain = api_key_create(tenant, name="plain")
    capped, capped_key = api_key_create(tenant, name="capped")
    limits_set(capped, limits={"max_tokens_limit": 4})
    app = GatewayApp(background=False)

    async def go(key: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            return await http.post("/v1/completions", json={"model": "tiny-llama", "prompt": "x", "max_tokens": 16})

    by_tenant, by_key = async_to_sync(go)(plain), async_to_sync(go)(capped_key)
    assert by_tenant.status_code == by_key.status_code == 400
    assert "cap of 8 tokens a request set on this tenant" in by_tenant.json()["error"]["message"], by_tenant.text
    assert "cap of 4 tokens a request set on this key" in by_key.json()["error"]["message"], by_key.text


@pytest.mark.django_db
def test_one_tenant_counts_one_long_prompt_at_a_time(base_model: Any) -> None:
    """Long prompts under a TPM limit are counted one at a time per tenant in a process, so one tenant's flood of
    100,000-character prompts (each a 429, none billed) cannot keep every tokenizer busy (attack round); another
    tenant's count runs beside it."""
    tenants = [TenantFactory(), TenantFactory()]
    keys = []
    for tenant in tenants:
        limits_set(tenant, limits={"tpm_limit": 1000})
        keys.append(api_key_create(tenant, name="app")[1])
    app = GatewayApp(background=False)
    running: dict[int, int] = {}
    peak: dict[int, int] = {}
    both = [0]

    salts = {hygiene.cache_salt(t.pk, settings.SECRET_KEY): t.pk for t in tenants}  # the body names its tenant

    async def slow_count(upstream: dict[str, Any], target: Any) -> Counted:
        tenant = salts[upstream["cache_salt"]]
        running[tenant] = running.get(tenant, 0) + 1
        peak[tenant] = max(peak.get(tenant, 0), running[tenant])
        both[0] = max(both[0], sum(running.values()))
        await asyncio.sleep(0.05)
        running[tenant] -= 1
        return Counted([5000])  # over the limit: a 429, as in the flood

    app._prompt_counts = slow_count  # type: ignore[method-assign]

    async def go() -> list[int]:
        async def one(key: str) -> int:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                         headers={"Authorization": f"Bearer {key}"}) as http:
                resp = await http.post("/v1/completions", json={"model": "tiny-llama", "prompt": "~" * 5000,
                                                                "max_tokens": 1})
            return resp.status_code

        return list(await asyncio.gather(*(one(keys[i % 2]) for i in range(6))))

    statuses = async_to_sync(go)()
    assert statuses == [429] * 6
    assert peak == {tenants[0].pk: 1, tenants[1].pk: 1} and both[0] == 2
