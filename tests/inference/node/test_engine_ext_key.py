"""The engine extension refuses to start, and to serve, without a node key (no engine needed)."""

from __future__ import annotations

import asyncio
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
