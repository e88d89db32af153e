"""An engine that lies about usage (a host holding a node key, answering as its node) cannot bill a tenant past its
request: completion tokens at most the budget asked for, prompt tokens at most the body's bytes and a template's
room, every count within the usage table's int4. An attack round's stub engine, registered as a node, billed a
``max_tokens`` 3 request 900,000,000 tokens each way, and a count past 2**31 - 1 made the row's write fail: the
request unbilled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from transformers import AutoTokenizer

from demo.tiny_model import TOOLS_PREAMBLE
from inference.gateway import exchange as gateway_exchange
from inference.gateway.app import GatewayApp
from inference.gateway.limits import CHAT_TEMPLATE_ROOM
from inference.gateway.snapshot import NodeView
from inference.gateway.usage_sink import UsageSink
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_records_write
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.engine_answer import EngineAnswer
from tests.fixtures.engine_stream import EngineStream, usage_chunks

NODE = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)
HUGE = 900_000_000


def _lying_stream(claim: int) -> EngineStream:
    """An SSE answer of two choices whose running and final usage claim ``claim`` tokens each way."""
    return EngineStream(usage_chunks(prompt=claim, completion=claim, choices=2))


def _billed(monkeypatch: pytest.MonkeyPatch, answer: Any, body: dict[str, Any],
            sent: list[bytes] | None = None) -> dict[str, Any]:
    """The usage row the gateway emits for ``body`` (to /v1/completions, or chat when it has ``messages``) when the
    engine answers ``answer()``; the body the engine got is appended to ``sent``."""
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    rows: list[dict[str, Any]] = []

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> Any:
        if sent is not None:
            sent.append(content)
        return answer()

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    monkeypatch.setattr(UsageSink, "emit", lambda self, row: rows.append(row))
    endpoint = "chat/completions" if "messages" in body else "completions"

    app = GatewayApp(background=False)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            response = await http.post(f"/v1/{endpoint}", headers={"Authorization": f"Bearer {key}"},
                                       json={"model": "tiny-llama", **body})
        await app.settled()  # a chat past its body's bound is metered once its template sized it
        return response

    response = async_to_sync(go)()
    assert response.status_code == 200, response.text
    assert len(rows) == 1, rows
    shown = _client_usage(response)
    if shown is not None:  # the client's usage is what it is billed, not the engine's claim (issue 30)
        assert (shown["prompt_tokens"], shown["completion_tokens"], shown["total_tokens"]) == (
            rows[0]["prompt_tokens"], rows[0]["completion_tokens"],
            rows[0]["prompt_tokens"] + rows[0]["completion_tokens"]), (shown, rows[0])
    return rows[0]


def _client_usage(response: httpx.Response) -> dict[str, Any] | None:
    """The ``usage`` the client was shown: the JSON answer's, or a stream's last chunk carrying one."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return response.json().get("usage")
    chunks = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: {")]
    return next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)


def _json_answer(claim: int) -> EngineAnswer:
    return EngineAnswer(200, {"id": "x", "object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": "PWNED", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": claim, "completion_tokens": claim, "total_tokens": 2 * claim}})


@pytest.mark.django_db
@pytest.mark.parametrize("shape", ["json", "stream"])
def test_an_engine_claiming_huge_usage_bills_at_most_the_request(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, shape: str) -> None:
    answer = (lambda: _json_answer(HUGE)) if shape == "json" else (lambda: _lying_stream(HUGE))
    body = {"prompt": "France:", "max_tokens": 3, "n": 2, "stream": shape == "stream"}
    if shape == "stream":
        body["stream_options"] = {"include_usage": True}  # the client asks to see the usage: it sees the bill
    row = _billed(monkeypatch, answer, body)
    assert row["completion_tokens"] == 6  # max_tokens × n
    assert 0 < row["prompt_tokens"] <= 500  # the body's bytes and a template's room, not 900,000,000


@pytest.mark.django_db
def test_a_chat_without_max_tokens_is_billed_within_the_usage_column(
        monkeypatch: pytest.MonkeyPatch, base_model: Any) -> None:
    row = _billed(monkeypatch, lambda: _lying_stream(10**15),
                  {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                   "stream_options": {"include_usage": True}})
    assert row["completion_tokens"] == 2**31 - 1  # no budget asked for: the column's bound
    assert row["prompt_tokens"] <= 500
    usage_records_write([row])  # a count past int4 made the database refuse the row, and the drain drop it
    record = UsageRecord.objects.get(request_id=row["request_id"])
    assert record.completion_tokens == 2**31 - 1


@pytest.mark.django_db
def test_an_honest_engine_is_billed_what_it_reports(monkeypatch: pytest.MonkeyPatch, base_model: Any) -> None:
    row = _billed(monkeypatch, lambda: _lying_stream(3), {"prompt": "France:", "max_tokens": 3, "n": 2,
                                                          "stream": True})
    assert (row["prompt_tokens"], row["completion_tokens"]) == (3, 3)


# A chat with a tool: the suite's tiny model renders tools as Llama 3.1's template does (a system preamble and each
# tool as indented JSON, ``demo.tiny_model.CHAT_TEMPLATE``), far more tokens than the request has bytes.
TOOLS_CHAT = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
              "tool_choice": "none", "max_tokens": 1}
VLLM_TOOLS = [{"type": "function", "function": {"name": "f", "description": None, "parameters": None}}]  # its dump


def _engine_count(tiny_base_dir: Path) -> int:
    """vLLM's count of ``TOOLS_CHAT``'s prompt: transformers' render of the model's template with the tools as
    vLLM hands them over (its tool model's dump: description and parameters null when absent), tokenized without
    specials added (412 tokens; the suite's engine says the same: ``tests/e2e/test_exact_metering_live.py``)."""
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_base_dir))
    ids = tokenizer.apply_chat_template(TOOLS_CHAT["messages"], tools=VLLM_TOOLS, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return len(ids)


@pytest.mark.django_db
@pytest.mark.parametrize("shape", ["json", "stream"])
def test_an_honest_count_of_a_template_that_writes_tools_is_billed_whole(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, tiny_base_dir: Path, shape: str) -> None:
    """The cap was the body's bytes plus 64 for the template: an honest engine's 412 tokens for a 313-byte chat were
    billed 377. Now the rendered template sizes the cap of a chat past its body's bound."""
    truth, sent = _engine_count(tiny_base_dir), []
    answer = (lambda: _json_answer(truth)) if shape == "json" else (
        lambda: EngineStream(usage_chunks(prompt=truth, completion=1)))
    row = _billed(monkeypatch, answer, {**TOOLS_CHAT, "stream": shape == "stream"}, sent)
    assert truth > len(sent[0]) + CHAT_TEMPLATE_ROOM  # what the old cap cut
    assert row["prompt_tokens"] == truth


@pytest.mark.django_db
def test_a_lying_engine_on_a_tools_chat_bills_at_most_its_rendered_prompt(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, tiny_base_dir: Path) -> None:
    sent: list[bytes] = []
    row = _billed(monkeypatch, lambda: _lying_stream(HUGE),
                  {**TOOLS_CHAT, "stream": True, "stream_options": {"include_usage": True}}, sent)
    truth = _engine_count(tiny_base_dir)
    # BOS, the preamble, the tool as indented JSON, "\n\n" and "hi": 627 bytes, against 900,000,000 claimed
    rendered = len("<s>" + TOOLS_PREAMBLE + json.dumps(VLLM_TOOLS[0], indent=4) + "\n\nhi")
    assert truth <= row["prompt_tokens"] <= rendered + CHAT_TEMPLATE_ROOM
    assert row["completion_tokens"] == 1  # max_tokens 1, n 1


# --- Prompt counts: only the serving node's engine counts, capped (issue 30) ------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["bot", "tiny-llama"])
def test_a_rogue_idle_node_neither_sees_nor_inflates_prompts_it_does_not_serve(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, caplog: pytest.LogCaptureFixture, model: str) -> None:
    """Under a TPM limit, a prompt the gateway cannot count itself (a chat with tools) was counted by the live node
    with the fewest waiting requests, whatever node served it: a rogue node claiming to be idle received other
    tenants' prompts and answered 1,000,000,000 tokens (a 429 for every TPM-limited key). Now the node routing
    picks counts it and then serves it, and its count is capped at the prompt's byte bound. For the base model the
    rogue, idle, is picked and serves the request itself: its count cannot refuse it either."""
    import logging

    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_create
    from inference.gateway import limits
    from inference.gateway.snapshot import FleetView, PlacementView
    from tenants.services import limits_set

    tenant = TenantFactory()
    limits_set(tenant, limits={"tpm_limit": 1000})
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                            s3_prefix="x/", files=[], status="ready", r=8)
    honest = NodeView(pk=1, name="honest", engine_url="http://honest.invalid", base_model_id=base_model.pk,
                      max_lora_rank=16, max_loras=4, num_requests_waiting=5, num_requests_running=8)
    rogue = NodeView(pk=2, name="rogue", engine_url="http://rogue.invalid", base_model_id=base_model.pk,
                     max_lora_rank=16, max_loras=4)
    fleet = FleetView(nodes=(honest, rogue), placements={version.pk: (PlacementView(
        node_id=1, version_id=version.pk, tier="warm", served=True),)}, read_at=1e12)
    counted_at: list[str] = []
    sent_to: list[str] = []

    async def engine_token_count(url: str, *, node_key: str, body: dict[str, Any]) -> int:
        counted_at.append(url)
        return 1_000_000_000

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> Any:
        sent_to.append(url.split("/v1/")[0])
        return _lying_stream(3)

    async def the_fleet() -> FleetView:
        return fleet

    monkeypatch.setattr(limits, "engine_token_count", engine_token_count)
    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(UsageSink, "emit", lambda self, row: None)
    monkeypatch.setattr("inference.gateway.directory.Directory.fleet", lambda self: the_fleet())
    app = GatewayApp(background=False)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            return await http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": model, "messages": [{"role": "user", "content": "secret"}],
                                         "tools": [tool], "max_tokens": 3})

    with caplog.at_level(logging.WARNING, logger="inference.gateway.limits"):
        response = async_to_sync(go)()
    assert response.status_code == 200, response.text
    serving = "http://honest.invalid" if model == "bot" else "http://rogue.invalid"
    assert counted_at == [serving] and sent_to == [serving]  # the prompt went to the serving node alone
    assert [r.getMessage() for r in caplog.records].count("gateway.engine_count_bounded") == 1


@pytest.mark.django_db
def test_a_non_streamed_answer_shows_the_billed_usage(monkeypatch: pytest.MonkeyPatch, base_model: Any) -> None:
    """An answer the gateway assembles from the engine's stream showed the engine's claim (2,147,483,647 tokens)
    in ``usage`` while the bill was bounded; now both are the bill (``_billed`` compares them)."""
    row = _billed(monkeypatch, lambda: _lying_stream(2**31 - 1), {"prompt": "France:", "max_tokens": 3, "n": 2})
    assert row["completion_tokens"] == 6 and row["prompt_tokens"] < 500
