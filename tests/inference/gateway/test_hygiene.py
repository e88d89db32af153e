"""Request hygiene as a pure function: each edge input gets a 400 naming its field; only allowed fields reach vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from inference.gateway.errors import GatewayError
from inference.gateway.hygiene import Caps, cache_salt, upstream_body

CAPS = Caps(max_tokens=64, n=4, logprobs=5)


def _check(body: dict[str, Any], endpoint: str = "completions", caps: Caps = CAPS) -> dict[str, Any]:
    return upstream_body({"model": "m", **body}, endpoint=endpoint, caps=caps, salt="salt")


def _refused(body: dict[str, Any], endpoint: str = "completions") -> GatewayError:
    with pytest.raises(GatewayError) as err:
        _check(body, endpoint)
    assert err.value.status == 400
    return err.value


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "stream": "false"}, "stream"),
    ({"prompt": "x", "stream": True, "stream_options": "yes"}, "stream_options"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"prompt": "x", "n": "2"}, "n"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "max_tokens": "16"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": 3}, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1, 2], "x"]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "request_id": "mine"}, "request_id"),
    ({"prompt": "x", "cache_salt": "share-with-others"}, "cache_salt"),
    ({"prompt": "x", "priority": -100}, "priority"),
    ({"prompt": "x", "kv_transfer_params": {}}, "kv_transfer_params"),
    ({"prompt": "x", "max_tokenz": 5}, "max_tokenz"),
])
def test_edge_inputs_on_completions_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert _refused(body).param == param


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ secrets }}"}, "chat_template"),
    ({"prompt": "x"}, "prompt"),  # a completions field on chat
])
def test_edge_inputs_on_chat_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert _refused(body, "chat/completions").param == param


def test_caps_on_max_tokens_n_best_of_and_logprobs() -> None:
    assert _refused({"prompt": "x", "max_tokens": 65}).param == "max_tokens"
    assert _refused({"prompt": "x", "n": 5}).param == "n"
    assert _refused({"prompt": "x", "n": 2, "best_of": 1}).param == "best_of"
    assert _refused({"prompt": "x", "logprobs": 6}).param == "logprobs"
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert _refused({**chat, "max_completion_tokens": 100}, "chat/completions").param == "max_completion_tokens"
    assert _refused({**chat, "logprobs": True, "top_logprobs": 9}, "chat/completions").param == "top_logprobs"
    assert _check({"prompt": "x"})["max_tokens"] == 64  # a missing length gets the cap
    assert "max_tokens" not in _check({"prompt": "x"}, caps=Caps())


def test_only_allowed_fields_reach_the_engine_with_the_tenant_salt() -> None:
    out = _check({"prompt": ["a", "b"], "max_tokens": 8, "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}, "user": "u-1", "metadata": {"k": "v"},
                  "ignore_eos": True, "return_token_ids": True, "seed": None})
    assert out == {"prompt": ["a", "b"], "max_tokens": 8, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}, "ignore_eos": True, "return_token_ids": True,
                   "cache_salt": "salt"}
    chat = _check({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": None, "tool_calls": []}]}, "chat/completions")
    assert chat["messages"][1] == {"role": "user", "content": "hi"}


def test_cache_salt_is_per_tenant_stable_and_secret_bound() -> None:
    assert cache_salt(1, "s" * 32) == cache_salt(1, "s" * 32)
    assert cache_salt(1, "s" * 32) != cache_salt(2, "s" * 32)
    assert cache_salt(1, "s" * 32) != cache_salt(1, "t" * 32)
    assert len(cache_salt(1, "s" * 32)) <= 128 and "/" not in cache_salt(1, "s" * 32)  # vLLM's salt rules


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "top_k": 2**64}, "top_k"),  # the engine answered 500 (a 502 to the client)
    ({"prompt": "x", "min_tokens": 2**40}, "min_tokens"),
    ({"prompt": [2**40]}, "prompt"),
    ({"prompt": "x", "stop_token_ids": [2**31]}, "stop_token_ids"),
    ({"prompt": ["a"] * 5}, "prompt"),  # 5 prompts x n 1 = 5 choices, over the cap of 4
    ({"prompt": ["a", "b"], "n": 3}, "prompt"),
])
def test_engine_side_bounds_and_prompt_lists_against_the_choice_cap(body: dict[str, Any], param: str) -> None:
    assert _refused(body).param == param


def test_a_prompt_list_reserves_its_completion_budget_per_prompt() -> None:
    from inference.gateway.hygiene import prompt_count, requested_tokens
    out = _check({"prompt": ["a", "b"], "n": 2, "max_tokens": 3})
    assert prompt_count(out) == 2 and requested_tokens(out) == 12
    assert prompt_count(_check({"prompt": [1, 2, 3], "max_tokens": 3})) == 1  # one prompt as token ids
    assert requested_tokens(_check({"prompt": [[1], [2]], "max_tokens": 5})) == 10



CHAT_HI = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("body", "endpoint", "param"), [
    # Each of these passed here and came back from vLLM as a 400 with `param: null`.
    ({"prompt": "x", "stop": ""}, "completions", "stop"),
    ({"prompt": "x", "stop": ["END", ""]}, "completions", "stop"),
    ({"prompt": "x", "stop": 5}, "completions", "stop"),
    ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "completions", "min_tokens"),
    ({"prompt": "x", "min_tokens": 65}, "completions", "min_tokens"),  # over the cap filled in as max_tokens
    ({"messages": [CHAT_HI], "max_completion_tokens": 4, "min_tokens": 5}, "chat/completions", "min_tokens"),
    ({"messages": [CHAT_HI, {"role": "user", "content": [{"text": "x"}]}]}, "chat/completions",
     "messages[1].content[0].type"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "chat/completions", "messages[0].content[0]"),
    ({"messages": [CHAT_HI, CHAT_HI, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, "chat/completions",
     "messages[2].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio"}]}]},
     "chat/completions", "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "chat/completions",
     "messages[0].content[0].type"),  # refusals are the assistant's
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "chat/completions",
     "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "chat/completions",
     "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "image_url": "u"}]}]},
     "chat/completions", "messages[0].content[0].image_url"),
    ({"messages": [{"role": "assistant", "tool_calls": "call it"}]}, "chat/completions", "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [5]}]}, "chat/completions", "messages[0].tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}]}, "chat/completions", "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "custom", "function": {
        "name": "f", "arguments": "{}"}}]}]}, "chat/completions", "messages[0].tool_calls[0].type"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]}, "chat/completions",
     "messages[0].tool_calls[0].function"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "arguments": "{}"}}]}]}, "chat/completions", "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "f", "arguments": 5}}]}]}, "chat/completions", "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "chat/completions",
     "messages[0].tool_calls"),
])
def test_what_the_engine_refused_is_a_400_naming_the_field(body: dict[str, Any], endpoint: str, param: str) -> None:
    error = _refused(body, endpoint)
    assert error.param == param
    assert f"'{param}'" in error.message  # the message names the field too


def test_valid_openai_chat_bodies_with_parts_tool_calls_and_stops_pass() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "42"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}, {"type": "text", "text": "ok"}]},
        {"role": "assistant", "content": "x", "tool_calls": [{**call, "function": {"name": "f", "arguments": {}}}]},
        {"role": "user", "content": []},
    ]
    out = _check({"messages": messages, "stop": ["\n\n", "END"], "min_tokens": 2, "max_completion_tokens": 8},
                 "chat/completions")
    assert out["messages"] == messages and out["stop"] == ["\n\n", "END"]
    assert _check({"prompt": "x", "stop": [], "min_tokens": 64})["max_tokens"] == 64  # up to the length is fine


def test_a_100_kb_field_name_or_number_is_not_echoed_whole() -> None:
    huge_key = "k" * 100_000
    error = _refused({"prompt": "x", huge_key: 1})
    assert error.code == "unknown_parameter" and "k" * 100 + "…" in error.message
    assert len(error.message) < 300 and len(error.param or "") <= 101
    assert len(_refused({"prompt": "x", "n": 10**4000}).message) < 300


def test_grammars_are_bounded_before_the_engine_compiles_them() -> None:
    """A 20,000-entry enum stalled the node's grammar compiler for every tenant and ``a{10000}`` crashed it (attack
    round): the schema's size and its patterns' repetition counts are capped, ordinary schemas pass."""
    schema = {"type": "json_schema", "json_schema": {"name": "pick", "schema": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2,3}-[0-9]{4}$"},
                                         "colour": {"enum": ["red", "green", "blue"]}}}}}
    assert _check({"prompt": "x", "response_format": schema})["response_format"] == schema
    huge = {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": [f"v{i}" for i in range(20000)]}}}
    error = _refused({"prompt": "x", "response_format": huge})
    assert error.param == "response_format" and "over the cap of 16384 bytes" in error.message
    for pattern in ("a{10000}", "a{2,5000}", "a{ 1001 }"):
        bad = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string", "pattern": pattern}}}
        error = _refused({"prompt": "x", "response_format": bad})
        assert error.param == "response_format" and "over the cap of 1000" in error.message, pattern
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "b{9999}"}}}
    error = _refused({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}, "chat/completions")
    assert error.param == "tools"


@pytest.mark.parametrize(("body", "endpoint"), [
    ({"prompt": "x", "echo": True, "logprobs": 0}, "completions"),
    ({"prompt": "x", "echo": True, "logprobs": 1}, "completions"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, "chat/completions"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True, "logprobs": True, "top_logprobs": 2},
     "chat/completions"),
])
def test_echo_that_would_ask_for_prompt_logprobs_is_refused(body: dict[str, Any], endpoint: str) -> None:
    """vLLM turns these into ``prompt_logprobs``, which killed the engine for every tenant when batched beside a
    LoRA request (attack round); ``prompt_logprobs`` itself was already refused."""
    error = _refused(body, endpoint)
    assert error.param == "echo" and "logprobs" in error.message


def test_echo_alone_and_logprobs_alone_still_pass() -> None:
    assert _check({"prompt": "x", "echo": True})["echo"] is True
    assert _check({"prompt": "x", "logprobs": 2})["logprobs"] == 2
    assert _check({"prompt": "x", "echo": False, "logprobs": 2})["logprobs"] == 2
    assert _check({"messages": [{"role": "user", "content": "x"}], "echo": False}, "chat/completions")["echo"] is False
