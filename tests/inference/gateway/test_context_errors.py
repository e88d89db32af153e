"""vLLM's refusals of a request that cannot fit the model's context become a 400 that names the field and the fix
(``inference.gateway.app._engine_error``), never the engine's wording, served names or a generic "check the request"."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.gateway import exchange as gateway_exchange
from inference.gateway.answers import engine_error as _engine_error
from inference.gateway.app import GatewayApp
from inference.gateway.snapshot import NodeView, TargetView
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.engine_answer import EngineAnswer

TARGET = TargetView(requested="support-bot", base_model_id=1, base_model_name="tiny-llama",
                    served_name="acme--support-bot--7", version_id=7, version_number=1)


def _vllm(message: str, param: str | None) -> dict[str, Any]:
    """A vLLM 0.x OpenAI server's 400 body (``VLLMValidationError``)."""
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


# Verbatim from vllm/renderers/params.py (TokenizeParams.__post_init__, _token_len_check, _text_len_check).
OUTPUT_OVER = _vllm("max_tokens=5000 cannot be greater than max_model_len=2048. Please request fewer output tokens.",
                    "max_tokens")
CHAT_OUTPUT_OVER = _vllm("max_completion_tokens=4096 cannot be greater than max_model_len=2048. Please request fewer "
                         "output tokens.", "max_completion_tokens")
PROMPT_OVER = _vllm("This model's maximum context length is 512 tokens. However, your prompt contains at least 513 "
                    "input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
                    "of the input prompt.", "input_tokens")
PROMPT_CHARS_OVER = _vllm("This model's maximum context length is 512 tokens. However, your prompt contains 9000 "
                          "characters (more than 5120 characters, which is the upper bound for 512 input tokens). "
                          "Please reduce the length of the input prompt.", "input_text")
# Older vLLM: the sum of prompt and completion, with the prompt's count.
SUM_OVER = _vllm("This model's maximum context length is 2048 tokens. However, you requested 5012 tokens (12 in the "
                 "messages, 5000 in the completion). Please reduce the length of the messages or completion.", None)


@pytest.mark.parametrize(("body", "endpoint", "param", "says"), [
    (OUTPUT_OVER, "completions", "max_tokens",
     "Invalid 'max_tokens': 5000 exceeds the context of model `support-bot`, 2048 tokens; lower 'max_tokens' to at "
     "most 2048 (a completion that does not fit beside the prompt stops early, finish_reason \"length\")."),
    (CHAT_OUTPUT_OVER, "chat/completions", "max_completion_tokens",
     "Invalid 'max_completion_tokens': 4096 exceeds the context of model `support-bot`, 2048 tokens"),
    (SUM_OVER, "completions", "max_tokens",
     "Invalid 'max_tokens': 5000 exceeds the context of model `support-bot`, 2048 tokens, minus the prompt's 12; "
     "lower 'max_tokens' to at most 2036."),
    (PROMPT_OVER, "completions", "prompt",
     "Invalid 'prompt': the prompt is at least 513 tokens, more than the context of model `support-bot`, 512 tokens, "
     "holds, with no room left for a completion; shorten 'prompt'."),
    (PROMPT_OVER, "chat/completions", "messages", "shorten 'messages'"),
    (PROMPT_CHARS_OVER, "completions", "prompt", "the prompt is 9000 characters, more than the context"),
])
def test_context_refusals_name_the_field_and_the_fix(body: dict[str, Any], endpoint: str, param: str,
                                                     says: str) -> None:
    error = _engine_error(400, body, TARGET, node_name="n1", endpoint=endpoint)
    assert (error.status, error.code, error.type, error.param) == (400, "context_length_exceeded",
                                                                   "invalid_request_error", param)
    assert says in error.message
    assert "acme--" not in error.message and "vLLM" not in error.message and "Please" not in error.message


@pytest.mark.parametrize("message", [
    "max_tokens=" + "9" * 5000 + " cannot be greater than max_model_len=2048.",
    "maximum context length is " + "9" * 5000 + " tokens. However, you requested 5 tokens (1 in the messages, 4 in "
    "the completion).",
    "maximum context length is 512 tokens. However, your prompt contains " + "9" * 5000 + " input tokens",
])
def test_a_figure_past_ints_digit_limit_is_no_500(message: str) -> None:
    """int() refuses more than 4,300 digits (a ValueError, which escaped as a 500): the generic 400 instead."""
    error = _engine_error(400, _vllm(message, "max_tokens"), TARGET, endpoint="completions")
    assert error.status == 400 and "acme--" not in error.message


@pytest.mark.parametrize("message", [
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
    'tool_choice="required" requires --tool-call-parser to be set',
])
def test_tools_on_an_engine_without_tool_calling_name_the_callers_fix_not_the_engines_flags(message: str) -> None:
    """Before: the engine's message passed on, asking the caller for launch flags they cannot set, with param null."""
    error = _engine_error(400, _vllm(message, None), TARGET, endpoint="chat/completions")
    assert (error.status, error.code, error.param) == (400, "tools_not_supported", "tools")
    assert error.message == ("The model `support-bot` is served without tool calling; remove 'tools' and "
                             "'tool_choice' from the request.")
    assert "--" not in error.message


def test_other_refusals_pass_on_the_engines_reason_when_it_tells_nothing_internal() -> None:
    """vLLM's sampling-parameter refusals are the caller's to read (fresh-user finding: n=2 at temperature 0 got only
    "check the request's parameters"); any that names a served model, an adapter, a node or a path stays generic."""
    error = _engine_error(400, _vllm("n must be 1 when using greedy sampling, got 2.", "n"), TARGET)
    assert (error.code, error.param) == ("invalid_request", "n")
    assert error.message == "The engine refused the request (field 'n'): n must be 1 when using greedy sampling, got 2."
    for leaky in ("model acme--support-bot--7 has no such option", "LoRA rank 64 is greater than max_lora_rank 16",
                  "tiny-llama does not support it", "failed to read /srv/models/x", "x" * 301):
        generic = _engine_error(400, _vllm(leaky, "temperature"), TARGET)
        assert generic.message.endswith("check the request's parameters against the model's limits."), leaky




@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body", "engine_answer", "param"), [
    ("/v1/completions", {"prompt": "France:", "max_tokens": 5000}, OUTPUT_OVER, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 600}], "max_tokens": 4},
     PROMPT_OVER, "messages"),
])
def test_the_caller_gets_the_named_field_through_the_gateway(monkeypatch: pytest.MonkeyPatch, base_model: Any,
                                                             path: str, body: dict[str, Any],
                                                             engine_answer: dict[str, Any], param: str) -> None:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="support-bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> EngineAnswer:
        return EngineAnswer(400, engine_answer)

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=GatewayApp(background=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post(path, headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "support-bot", **body})

    response = async_to_sync(go)()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", param)
    assert f"Invalid '{param}'" in error["message"] and "model `support-bot`" in error["message"]
    assert "BadRequestError" not in response.text
