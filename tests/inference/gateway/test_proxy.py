"""SSE relay: model names rewritten back, usage captured, the usage-only chunk hidden unless asked for."""

from __future__ import annotations

import asyncio
import json

import httpx

from inference.gateway.proxy import relay_sse

SSE = (
    'data: {"id":"1","model":"acme--bot--7","choices":[{"index":0,"delta":{"content":"Pa"}}]}\n\n'
    'data: {"id":"1","model":"acme--bot--7","choices":[{"index":0,"delta":{"content":"ris"}}],"usage":null}\n\n'
    'data: {"id":"1","model":"acme--bot--7","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
)


def _relay(keep_usage: bool) -> tuple[list[str], list[object]]:
    seen: list[object] = []

    async def done(usage: object) -> None:
        seen.append(usage)

    async def run() -> list[str]:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=SSE))
        client = httpx.AsyncClient(transport=transport)
        response = await client.send(client.build_request("POST", "http://engine/v1/completions"), stream=True)
        return [c.decode() async for c in relay_sse(client, response, served="acme--bot--7", requested="bot",
                                                    keep_usage=keep_usage, on_done=done)]

    return asyncio.run(run()), seen


def test_relay_rewrites_model_and_meters_without_leaking_usage() -> None:
    events, seen = _relay(keep_usage=False)
    payloads = [json.loads(e[6:]) for e in events if e != "data: [DONE]\n\n"]
    assert [p["model"] for p in payloads] == ["bot", "bot"]
    assert all("usage" not in p for p in payloads)
    assert events[-1] == "data: [DONE]\n\n"
    assert seen == [{"prompt_tokens": 4, "completion_tokens": 2}]


def test_relay_keeps_usage_when_the_client_asked() -> None:
    events, _ = _relay(keep_usage=True)
    assert len(events) == 4
    assert json.loads(events[2][6:])["usage"]["completion_tokens"] == 2
    assert "acme--bot--7" not in "".join(events)
