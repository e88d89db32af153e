"""SSE relay: model names rewritten back, usage captured, the usage-only chunk hidden unless asked for, and a
stream the engine cuts ends with an OpenAI error event metered as 502 with the tokens sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from inference.gateway.relay import relay_stream
from inference.gateway.snapshot import TargetView
from inference.gateway.upstream import upstream_close, upstream_post

SSE = (
    'data: {"id":"1","model":"acme--bot--7","choices":[{"index":0,"text":"Pa"}],'
    '"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n'
    'data: {"id":"1","model":"acme--bot--7","choices":[{"index":0,"text":"ris"}],'
    '"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    'data: {"id":"1","model":"acme--bot--7","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
)
TARGET = TargetView(requested="bot", base_model_id=1, base_model_name="tiny", served_name="acme--bot--7",
                    version_id=7, version_number=1)


async def _engine(request: web.Request) -> web.StreamResponse:
    """A real HTTP server sending ``SSE`` in chunks split mid-line; ``/cut`` drops the connection after one event."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if request.path == "/engine-error":  # vLLM's mid-stream failure: its own dialect, then [DONE]
        await response.write(SSE.split("\n\n")[0].encode() + b"\n\n")
        await response.write(b'data: {"error":{"message":"Internal server error: torch blew up at /opt/vllm",'
                             b'"type":"InternalServerError","param":null,"code":500}}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response
    if request.path == "/cut":
        await response.write(SSE.split("\n\n")[0].encode() + b"\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response
    data = SSE.encode()
    for i in range(0, len(data), 37):
        await response.write(data[i:i + 37])
    await response.write_eof()
    return response


def _relay(path: str, keep_usage: bool) -> tuple[list[str], list[tuple[int, Any]]]:
    seen: list[tuple[int, Any]] = []

    def record(status: int, usage: Any, ttft_ms: float | None = None) -> None:
        seen.append((status, usage))

    async def run() -> list[str]:
        app = web.Application()
        app.router.add_post("/{tail:.*}", _engine)
        async with TestServer(app) as server:
            try:
                response = await upstream_post(str(server.make_url(path)), content=b"{}", node_key="k")
                events = relay_stream(response, target=TARGET, keep_usage=keep_usage, record=record,
                                           started=0.0)
                return [c.decode() async for c in events]
            finally:
                await upstream_close()

    return asyncio.run(run()), seen


def test_relay_rewrites_model_and_meters_without_leaking_usage() -> None:
    events, seen = _relay("/v1/completions", keep_usage=False)
    payloads = [json.loads(e[6:]) for e in events if e != "data: [DONE]\n\n"]
    assert [p["model"] for p in payloads] == ["bot", "bot"]
    assert all("usage" not in p for p in payloads)
    assert events[-1] == "data: [DONE]\n\n"
    assert seen == [(200, {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6})]


def test_relay_keeps_usage_when_the_client_asked() -> None:
    events, _ = _relay("/v1/completions", keep_usage=True)
    assert len(events) == 4
    assert json.loads(events[0][6:])["usage"] is None  # OpenAI: usage only on the final chunk
    assert json.loads(events[2][6:])["usage"]["completion_tokens"] == 2
    assert "acme--bot--7" not in "".join(events)


def test_a_cut_stream_ends_with_an_error_event_and_is_metered_502_with_tokens_sent() -> None:
    events, seen = _relay("/cut", keep_usage=False)
    assert json.loads(events[0][6:])["choices"][0]["text"] == "Pa"
    error = json.loads(events[-1][6:])["error"]
    assert error["code"] == "upstream_stream_cut" and error["type"] == "server_error"
    assert "[DONE]" not in "".join(events)
    assert seen == [(502, {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5})]


def test_directory_cache_is_bounded_and_refreshes_stale_entries_in_the_background() -> None:
    from inference.gateway import directory

    loads: list[str] = []

    def loader(k: str) -> str:
        loads.append(k)
        return k.upper()

    async def run() -> None:
        original = directory.db_call

        async def inline(fn, *args):  # type: ignore[no-untyped-def]
            return fn(*args)

        directory.db_call = inline  # type: ignore[assignment]
        try:
            ttl = [(10.0, 20.0)]
            cache = directory.TtlCache(loader, lambda: ttl[0], max_entries=2)
            assert [await cache.get(k) for k in ("a", "b", "a", "c")] == ["A", "B", "A", "C"]
            assert loads == ["a", "b", "c"]
            assert await cache.get("a") == "A" and loads[-1] == "a"  # "a" was evicted first, so loaded again
            ttl[0] = (0.0, 20.0)  # stale but within the hard TTL: served, refreshed behind the scenes
            assert await cache.get("a") == "A"
            await asyncio.sleep(0)
            assert loads.count("a") == 3
            cache.invalidate(lambda k: k == ("a",))
            assert await cache.get("a") == "A" and loads.count("a") == 4
        finally:
            directory.db_call = original  # type: ignore[assignment]

    asyncio.run(run())


def test_engine_nulls_that_openai_never_sends_are_dropped_so_the_schema_holds() -> None:
    from pathlib import Path

    import llm_comply
    from llm_comply.schema import SpecLoader

    from inference.gateway.answers import strip_engine_fields as _strip_engine_fields

    # A vLLM 0.32 chat completion as the engine sends it (nulls where OpenAI's schema wants a value or nothing).
    vllm = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "bot", "service_tier": None,
            "system_fingerprint": None, "prompt_logprobs": None, "kv_transfer_params": None,
            "prompt_token_ids": None, "prompt_text": None,
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                         "token_ids": None, "message": {"role": "assistant", "content": "hi", "refusal": None,
                                                        "annotations": None, "audio": None, "function_call": None,
                                                        "tool_calls": [], "reasoning_content": None}}],
            "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None,
                      "completion_tokens_details": None}}
    spec = SpecLoader(str(Path(llm_comply.__file__).parent / "specs" / "openai_chat.json"))
    assert spec.validate(json.loads(json.dumps(vllm)), "CreateChatCompletionResponse")  # as sent: not conformant
    _strip_engine_fields(vllm)
    assert spec.validate(vllm, "CreateChatCompletionResponse") == []
    assert vllm["choices"][0]["message"]["refusal"] is None  # nullable in the schema: kept
    assert "prompt_token_ids" not in vllm and "prompt_text" not in vllm


def test_a_client_gone_before_the_first_byte_frees_the_slot_and_the_connection_and_is_billed_the_engines_totals() -> None:
    # uvicorn (ASGI spec 2.3) answers receive() with http.disconnect at once for a client that left while the
    # engine was starting; Starlette then cancels the body task at its first suspension. Here that is in send(), before
    # the relay's first step, so the relay's own finally (which releases the admission slot and settles the limits)
    # never runs: the response must do it.
    from inference.gateway.relay import relay_response

    seen: list[tuple[int, Any]] = []
    closed: list[bool] = []
    aborts: list[int] = []

    async def abort() -> bool:  # the engine took the abort: its stream ends with its totals, read here to the end
        aborts.append(1)
        return True

    def record(status: int, usage: Any, ttft_ms: float | None = None) -> None:
        seen.append((status, usage))

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0)

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", _engine)
        async with TestServer(app) as server:
            try:
                upstream = await upstream_post(str(server.make_url("/v1/completions")), content=b"{}", node_key="k")
                real_close = upstream.aclose

                async def aclose() -> None:
                    closed.append(True)
                    await real_close()

                upstream.aclose = aclose  # type: ignore[method-assign]
                response = relay_response(upstream, target=TARGET, keep_usage=False, record=record, started=0.0,
                                          headers={}, abort=abort)
                scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}
                await response(scope, receive, send)  # type: ignore[arg-type]
            finally:
                await upstream_close()

    asyncio.run(run())
    assert seen == [(499, {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6})]  # the engine's totals
    assert aborts == [1] and closed


def test_an_engine_error_mid_stream_becomes_our_error_event_metered_with_its_status() -> None:
    events, seen = _relay("/engine-error", keep_usage=False)
    assert json.loads(events[0][6:])["choices"][0]["text"] == "Pa"
    error = json.loads(events[-1][6:])["error"]
    assert error["code"] == "upstream_error" and error["type"] == "server_error"
    assert "torch" not in "".join(events) and "[DONE]" not in "".join(events)
    assert seen == [(502, {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5})]  # not 200: the client got an error
