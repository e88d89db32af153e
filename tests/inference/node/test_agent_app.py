"""`inference.node.agent:app`, the env-built ASGI app that uvicorn serves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inference.node import agent as agent_module


def _run_lifespan(app: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "lifespan.startup"}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    return sent


def test_missing_env_fails_server_startup_with_the_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("QUIVER_NODE_NAME", "QUIVER_NODE_KEY", "QUIVER_ENGINE_URL"):
        monkeypatch.delenv(name, raising=False)

    sent = _run_lifespan(agent_module._AppFromEnv())

    assert sent[0]["type"] == "lifespan.startup.failed"
    assert "QUIVER_NODE_KEY" in sent[0]["message"]


def test_env_builds_the_agent_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    env = {
        "QUIVER_NODE_NAME": "n1",
        "QUIVER_NODE_KEY": "k",
        "QUIVER_ENGINE_URL": "http://127.0.0.1:1",
        "QUIVER_BASE_MODEL": "tiny-llama",
        "QUIVER_NODE_CACHE_DIR": str(tmp_path / "cache"),
        "AWS_STORAGE_BUCKET_NAME": "b",
        "AWS_S3_ENDPOINT_URL": "http://127.0.0.1:1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("QUIVER_CONTROL_URL", raising=False)

    sent = _run_lifespan(agent_module._AppFromEnv())

    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert (tmp_path / "cache").is_dir()
