"""Hygiene on the real stack: edge inputs get OpenAI-shaped 4xx (never a 500 or HTML), engine errors come back in
OpenAI's dialect with our message, and one tenant's prompt never hits another tenant's prefix cache (vLLM
``cache_salt``)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)
LONG_PROMPT = "the cat sat on the mat and the dog ran to the park " * 15  # over one 128-token KV block


def _key() -> str:
    return api_key_create(TenantFactory(), name="k")[1]


def _post(url: str, key: str, body: object, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(url + path, headers={"Authorization": f"Bearer {key}"}, json=body, timeout=120)


def _prefix_hits(engine) -> float:  # type: ignore[no-untyped-def]
    text = httpx.get(engine.url + "/metrics", headers=engine.headers, timeout=10).text
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M))


def test_edge_inputs_are_openai_shaped_4xx(gateway_server: str, base_model) -> None:  # type: ignore[no-untyped-def]
    key = _key()
    cases = [
        ({"model": "tiny-llama", "prompt": "x", "stream": "false"}, "stream"),
        ({"model": "tiny-llama", "prompt": "x", "stream": True, "stream_options": "yes"}, "stream_options"),
        ({"model": "tiny-llama", "prompt": "x", "n": "two"}, "n"),
        ({"model": "tiny-llama", "prompt": "x", "request_id": "abc"}, "request_id"),
        ({"model": "tiny-llama", "prompt": "x", "cache_salt": "x"}, "cache_salt"),
    ]
    for body, param in cases:
        resp = _post(gateway_server, key, body)
        assert resp.status_code == 400 and resp.headers["content-type"] == "application/json", resp.text
        assert resp.json()["error"]["param"] == param
    chat = _post(gateway_server, key, {"model": "tiny-llama", "messages": "hello"}, "/v1/chat/completions")
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    unknown = httpx.post(gateway_server + "/v1/embeddings", headers={"Authorization": f"Bearer {key}"}, json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    wrong = httpx.get(gateway_server + "/v1/completions", headers={"Authorization": f"Bearer {key}"})
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    models = httpx.post(gateway_server + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 405 and models.json()["error"]["code"] == "method_not_allowed"


def test_engine_errors_are_mapped_and_prefix_cache_is_per_tenant(gateway_server: str, live_node,  # type: ignore[no-untyped-def]
                                                                  vllm_engine) -> None:
    alice, bob = _key(), _key()
    # The gateway's fleet view refreshes twice a second: wait until it has seen the node this test registered.
    deadline = time.monotonic() + 20
    while (too_long := _post(gateway_server, alice, {"model": "tiny-llama", "prompt": "the cat " * 600,
                                                      "max_tokens": 4})).status_code == 503:
        assert time.monotonic() < deadline, too_long.text
        time.sleep(0.2)
    assert too_long.status_code == 400, too_long.text
    error = too_long.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert "BadRequestError" not in too_long.text and "vllm" not in too_long.text.lower()
    assert (error["param"], "shorten 'prompt'" in error["message"]) == ("prompt", True)
    # A completion budget above the whole context (the session engine's --max-model-len 512): the field and the fix.
    too_many = _post(gateway_server, alice, {"model": "tiny-llama", "prompt": "the cat", "max_tokens": 5000})
    assert too_many.status_code == 400, too_many.text
    error = too_many.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    assert "Invalid 'max_tokens': 5000 exceeds the context of model `tiny-llama`, 512 tokens" in error["message"]
    assert "lower 'max_tokens' to at most 512" in error["message"]
    # The session engine runs without tool calling: a chat with `tools` names the caller's fix, not vLLM's flags.
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    with_tools = _post(gateway_server, alice, {"model": "tiny-llama", "max_tokens": 4, "tools": tools,
                                               "tool_choice": "auto", "messages": [{"role": "user", "content": "hi"}]},
                       "/v1/chat/completions")
    assert with_tools.status_code == 400, with_tools.text
    error = with_tools.json()["error"]
    assert (error["code"], error["param"]) == ("tools_not_supported", "tools")
    assert "remove 'tools'" in error["message"] and "--" not in error["message"]

    body = {"model": "tiny-llama", "prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0}
    assert _post(gateway_server, alice, body).status_code == 200
    before = _prefix_hits(vllm_engine)
    assert _post(gateway_server, alice, body).status_code == 200
    after_same_tenant = _prefix_hits(vllm_engine)
    assert after_same_tenant > before  # caching works within a tenant
    assert _post(gateway_server, bob, body).status_code == 200
    assert _prefix_hits(vllm_engine) == after_same_tenant  # but never across tenants


def test_the_engine_serves_nothing_but_health_and_metrics_without_the_node_key(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    # vLLM's own key check covers /v1/* only; its SageMaker-style /adapters and /invocations are guarded by ours.
    url = vllm_engine.url
    for method, path, body in (("POST", "/adapters", {"name": "x", "src": "/tmp"}), ("DELETE", "/adapters/x", None),
                               ("POST", "/invocations", {"prompt": "x", "max_tokens": 1}),
                               ("POST", "/tokenize", {"prompt": "x"}), ("GET", "/v1/models", None)):
        answer = httpx.request(method, url + path, json=body, timeout=30)
        assert answer.status_code == 401, (path, answer.status_code, answer.text[:200])
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert httpx.get(url + "/metrics", timeout=30).status_code == 200
    assert httpx.post(url + "/tokenize", json={"prompt": "x"}, headers=vllm_engine.headers,
                      timeout=30).status_code == 200
