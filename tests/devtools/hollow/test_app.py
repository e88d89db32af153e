"""The emulated engine over HTTP, read by the real clients: the agent's ``EngineHTTPClient`` and metrics parser, and
the gateway's ``UsageTally`` of a stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from devtools.hollow.app import create_app
from devtools.hollow.costs import calibration
from devtools.hollow.engine import HollowEngine
from devtools.synthetic_adapters import LLAMA_MODULES, peft_config
from inference.gateway.answers import UsageTally
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.node.engine_control import engine_tier
from inference.node.metrics import parse_engine_metrics

KEY = "node-key"
FAST = calibration("h100-8b", swap_fixed_ms=0.5, load_fixed_ms=0.5, decode_a_ms=0.2)


def _adapter(root: Path, name: str, r: int = 8) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(peft_config("base", r=r, target_modules=LLAMA_MODULES)))
    return str(folder)


def _run(body: Callable[[httpx.AsyncClient, HollowEngine], Awaitable[None]], *, max_loras: int = 2,
         max_cpu_loras: int = 3) -> None:
    async def run() -> None:
        engine = HollowEngine("base", FAST, max_loras=max_loras, max_cpu_loras=max_cpu_loras, tick_ms=1)
        transport = httpx.ASGITransport(app=create_app(engine, KEY))
        async with httpx.AsyncClient(transport=transport, base_url="http://hollow",
                                     headers={"Authorization": f"Bearer {KEY}"}) as http:
            await body(http, engine)

    asyncio.run(run())


def _events(text: str) -> list[Any]:
    lines = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_stream_carries_each_choices_usage_as_vllm_does() -> None:
    async def body(http: httpx.AsyncClient, _: HollowEngine) -> None:
        request = {"model": "base", "prompt": ["abcd" * 3, "ab"], "n": 2, "max_tokens": 5, "stream": True,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        answer = await http.post("/v1/completions", json=request)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        chunks = _events(answer.text)
        tally = UsageTally(n=2)
        for chunk in chunks:
            tally.add(chunk)
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
            "prompt_tokens": 3 + 1, "completion_tokens": 4 * 5, "total_tokens": 24}
        per_choice = {c["choices"][0]["index"]: c["usage"] for c in chunks[:-1]}
        assert per_choice[3] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
        assert per_choice[0]["prompt_tokens"] == 3
        assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]].count("length") == 4
        cut = UsageTally(n=2)  # a stream cut after its first chunks is billed what they show
        for chunk in chunks[:3]:
            cut.add(chunk)
        assert 0 < (cut.usage() or {})["completion_tokens"] < 20

    _run(body)


def test_chat_unstreamed_and_errors_in_vllms_shape(tmp_path: Path) -> None:
    async def body(http: httpx.AsyncClient, _: HollowEngine) -> None:
        chat = await http.post("/v1/chat/completions", json={
            "model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        assert chat.json()["usage"]["completion_tokens"] == 3
        missing = await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert missing.status_code == 404
        assert missing.json() == {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                            "param": "model", "code": 404}}
        bad = await http.post("/v1/completions", json={"model": "base", "prompt": "x", "n": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
        stranger = await http.post("/v1/completions", json={"model": "base", "prompt": "x"},
                                   headers={"Authorization": "Bearer other"})
        assert stranger.status_code == 401
        assert (await http.get("/health", headers={"Authorization": ""})).status_code == 200
        count = await http.post("/tokenize", json={"model": "base", "prompt": "abcdefgh"})
        assert count.json()["count"] == 2
        models = await http.get("/v1/models")
        assert [m["id"] for m in models.json()["data"]] == ["base"]

    _run(body)


def test_lora_routes_answer_the_agents_client(tmp_path: Path) -> None:
    async def body(http: httpx.AsyncClient, engine: HollowEngine) -> None:
        client = EngineHTTPClient(http, KEY)
        paths = {name: _adapter(tmp_path, name) for name in ("a", "b", "c", "d")}
        for i, name in enumerate("abc", start=1):
            await client.add_lora(name, i, paths[name], pin=False)
        report = await client.loras_report()
        tiers = {lora["lora_name"]: lora["tier"] for lora in report["loras"]}
        assert tiers == {"a": "cpu", "b": "gpu", "c": "gpu"}
        assert report["residency"]["bytes"]["3"] == 40 << 20  # r8 all-linear 8B adapter (JSON keys)
        assert await engine_tier(client, 2) == ("hot", 0.0)
        await client.add_lora("d", 4, paths["d"], pin=False)  # CPU cache of 3 full: LRU "a" is dropped
        tiers = {lora["lora_name"]: lora["tier"] for lora in await client.list_loras()}
        assert tiers["a"] == "disk"
        for call, code in ((client.add_lora("a", 9, paths["a"], pin=False), "lora_name_conflict"),
                           (client.add_lora("z", 2, paths["a"], pin=False), "lora_int_id_conflict"),
                           (client.add_lora("z", 9, str(tmp_path / "none"), pin=False), "engine_load_failed"),
                           (client.remove_lora("zz"), "lora_not_found"),
                           (client.set_eviction_policy("nope"), "invalid_policy")):
            try:
                await call
            except EngineError as exc:
                assert exc.code == code
            else:
                raise AssertionError(code)
        await client.pin_lora("b")
        await client.evict_lora("c")
        assert (await client.set_eviction_policy("lfu")) == {"policy": "lfu"}
        ids, logprobs = await client.complete_greedy("b", "probe", max_tokens=4)
        base_ids, _ = await client.complete_greedy("base", "probe", max_tokens=4)
        assert len(ids) == len(logprobs) == 4 and ids != base_ids  # the agent's effect probe sees the adapter
        report = await client.loras_report()
        assert report["residency"]["pinned"] == [2] and report["residency"]["loads_total"] == 4

    _run(body, max_cpu_loras=3)


def test_metrics_are_what_the_agent_parses(tmp_path: Path) -> None:
    async def body(http: httpx.AsyncClient, engine: HollowEngine) -> None:
        client = EngineHTTPClient(http, KEY)
        for i, name in enumerate("ab", start=1):
            await client.add_lora(name, i, _adapter(tmp_path, name), pin=False)
        engine.submit(4, 50, 1)
        engine.submit(4, 50, 2)  # max_loras 1: deferred while "a" runs
        engine.step()
        parsed = parse_engine_metrics(await client.metrics_text())
        assert parsed.num_requests_running == 1 and parsed.num_requests_waiting == 1
        assert parsed.running_lora_adapters == ["a"] and parsed.waiting_lora_adapters == ["b"]
        assert parsed.max_lora == 1 and parsed.num_preemptions_total == 0
        assert parsed.kv_cache_usage_perc is not None and parsed.kv_cache_usage_perc > 0
        text = await client.metrics_text()
        assert 'vllm:num_requests_waiting_by_reason{engine="0",model_name="base",reason="deferred"} 1.0' in text
        assert "vllm:generation_tokens_total" in text

    _run(body, max_loras=1)
