"""The engine extension refuses to start, and to serve, without a node key (no engine needed)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from inference.node.engine_ext import QuiverEngineExtension


def _run(scope: dict[str, Any], incoming: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    sent: list[dict[str, Any]] = []
    inner_calls: list[str] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        inner_calls.append(scope["type"])

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(QuiverEngineExtension(inner)(scope, receive, send))
    return sent, inner_calls


def test_without_a_key_startup_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    sent, inner = _run({"type": "lifespan"}, [{"type": "lifespan.startup"}])
    assert sent[0]["type"] == "lifespan.startup.failed" and "VLLM_API_KEY" in sent[0]["message"]
    assert inner == []


@pytest.mark.parametrize("path", ["/v1/completions", "/quiver/v1/loras", "/v1/load_lora_adapter"])
def test_without_a_key_every_request_is_refused(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "")
    sent, inner = _run({"type": "http", "path": path, "method": "GET", "headers": []}, [])
    assert sent[0]["status"] == 503 and inner == []


def test_with_a_key_requests_pass_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "k" * 40)
    _, inner = _run({"type": "lifespan"}, [])
    assert inner == ["lifespan"]


KEY = "k" * 40


@pytest.mark.parametrize("method,path", [
    ("POST", "/adapters"), ("DELETE", "/adapters/acme--bot--1"),  # vLLM's SageMaker-style LoRA routes
    ("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/openapi.json"), ("POST", "/v1/completions")])
def test_every_engine_path_but_health_and_metrics_needs_the_node_key(
        monkeypatch: pytest.MonkeyPatch, method: str, path: str) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    for headers in ([], [(b"authorization", b"Bearer wrong")], [(b"authorization", KEY.encode())]):
        sent, inner = _run({"type": "http", "path": path, "method": method, "headers": headers}, [])
        assert sent[0]["status"] == 401 and inner == [], (path, headers)
    _, inner = _run({"type": "http", "path": path, "method": method,
                     "headers": [(b"authorization", f"Bearer {KEY}".encode())]}, [])
    assert inner == ["http"]


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_health_and_metrics_are_served_without_a_key(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    _, inner = _run({"type": "http", "path": path, "method": "GET", "headers": []}, [])
    assert inner == ["http"]


class _Engine:
    """An engine client whose utility calls never answer (vLLM's, once its EngineCore died mid-call)."""

    def __init__(self, *, dies_after_s: float | None) -> None:
        self.dies_after_s, self.started, self.cancelled = dies_after_s, 0.0, False

    @property
    def errored(self) -> bool:
        loop = asyncio.get_running_loop()
        return self.dies_after_s is not None and loop.time() - self.started > self.dies_after_s

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.started = asyncio.get_running_loop().time()
        if self.dies_after_s is None:
            return [None]
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return []


def _hints(monkeypatch: pytest.MonkeyPatch, engine: _Engine) -> list[dict[str, Any]]:
    from types import SimpleNamespace

    from inference.node import engine_ext

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setattr(engine_ext, "ENGINE_ALIVE_POLL_S", 0.02)
    scope = {"type": "http", "path": "/quiver/v1/eviction_hints", "method": "POST",
             "headers": [(b"authorization", f"Bearer {KEY}".encode())],
             "app": SimpleNamespace(state=SimpleNamespace(engine_client=engine))}
    body = b'{"over_quota": [], "elsewhere": [], "valid_s": 1}'
    sent, _ = _run(scope, [{"type": "http.request", "body": body, "more_body": False}])
    return sent


def test_a_route_waiting_on_an_engine_that_died_answers_503_instead_of_hanging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM never fails a utility call in flight when its EngineCore dies; the route must not wait forever (uvicorn's
    # shutdown would wait on it, and the API server would never exit to be restarted).
    engine = _Engine(dies_after_s=0.05)
    sent = _hints(monkeypatch, engine)
    assert sent[0]["status"] == 503 and b"engine_dead" in sent[1]["body"]
    assert engine.cancelled


def test_a_live_engines_answer_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _hints(monkeypatch, _Engine(dies_after_s=None))
    assert sent[0]["status"] == 200


@pytest.mark.parametrize(("chunks", "status", "code"), [
    ([b"[" * 100_000 + b"]" * 100_000], 400, b"invalid_json"),  # nested past the parser's recursion limit
    ([b'{"request_ids": ["' + b"x" * 600_000] * 2, 413, b"body_too_large"),  # refused while read, not after
])
def test_an_abort_body_too_deep_or_too_large_is_refused_not_a_500(
        monkeypatch: pytest.MonkeyPatch, chunks: list[bytes], status: int, code: bytes) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    scope = {"type": "http", "path": "/quiver/v1/abort", "method": "POST",
             "headers": [(b"authorization", f"Bearer {KEY}".encode())], "app": SimpleNamespace(state=None)}
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent, _ = _run(scope, incoming)
    assert sent[0]["status"] == status and code in sent[1]["body"]
