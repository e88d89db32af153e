"""Attacks on the node agent's routes that need no engine: bodies sent without the node key, oversized bodies, and
races between an operator's ``POST /v1/eviction_policy`` and the state read that syncs the engine's policy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from inference.node.agent import MAX_BODY_BYTES, create_app
from inference.node.cache import AdapterCache
from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError
from inference.node.service import NodeAgent

KEY = "node-key-of-n1"


def _settings(tmp_path: Path, **changes: Any) -> NodeSettings:
    values: dict[str, Any] = dict(
        node_name="n1", node_key=KEY, node_token="", engine_url="http://127.0.0.1:9", base_model="tiny",
        cache_dir=tmp_path / "cache", agent_url="", s3_endpoint_url=None,
        control_url=None, heartbeat_seconds=5.0, max_loras=1, max_cpu_loras=1, max_lora_rank=16)
    values.update(changes)
    return NodeSettings(**values)


async def _post(app: Any, path: str, chunks: Iterable[bytes], headers: dict[str, str]) -> tuple[int, dict[str, Any], int]:
    """POST ``chunks`` as one streamed body straight through the ASGI app; returns (status, JSON body, chunks the app
    read)."""
    pending = list(chunks)
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(pending):
            read += 1
            return {"type": "http.request", "body": pending[read - 1], "more_body": read < len(pending)}
        await asyncio.sleep(3600)  # the client waits for the answer
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("203.0.113.9", 40000), "server": ("agent", 8100)}
    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), read


def _big_policy_body(megabytes: int) -> list[bytes]:
    """A valid JSON body for /v1/eviction_policy of ``megabytes`` MiB, in 1 MiB chunks."""
    filler = b"a" * (1 << 20)
    return [b'{"policy": "', *([filler] * megabytes), b'"}']


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer "},
                                     {"Authorization": "Basic " + KEY}], ids=["none", "wrong", "empty", "basic"])
def test_a_body_without_the_node_key_is_refused_before_a_byte_is_read(tmp_path: Path, headers: dict[str, str]) -> None:
    """FastAPI reads and parses a route's JSON body before its dependencies run, so the key check came after the
    whole body was in memory: anyone who reached the agent's port could make it buffer (and parse) gigabytes."""
    app = create_app(_settings(tmp_path))

    status, body, read = asyncio.run(_post(app, "/v1/eviction_policy", _big_policy_body(64),
                                           {"content-type": "application/json", **headers}))

    assert (status, body["code"]) == (401, "unauthorized")
    assert read == 0


def test_junk_json_without_the_node_key_is_401_not_a_parse_error(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))

    status, body, _ = asyncio.run(_post(app, "/v1/adapters/load", [b"{not json"],
                                        {"content-type": "application/json"}))

    assert (status, body["code"]) == (401, "unauthorized")


def test_an_oversized_body_with_the_key_is_413_naming_the_limit(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))
    auth = {"content-type": "application/json", "Authorization": f"Bearer {KEY}"}
    declared = {**auth, "content-length": str(64 << 20)}

    status, body, read = asyncio.run(_post(app, "/v1/eviction_policy", _big_policy_body(64), declared))
    assert (status, body["code"]) == (413, "request_too_large")
    assert str(MAX_BODY_BYTES) in body["detail"]
    assert read == 0  # the declared length is enough

    # Chunked (no content-length): read up to the limit, then refused.
    status, body, read = asyncio.run(_post(app, "/v1/eviction_policy", _big_policy_body(64), auth))
    assert (status, body["code"]) == (413, "request_too_large")
    assert read <= MAX_BODY_BYTES // (1 << 20) + 2


class _Engine:
    """The engine as the agent sees it: ``set_eviction_policy`` applies at once, and its answer may be held back
    (``hold``) as if the response were still on the wire."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.hold = asyncio.Event()
        self.holding = 0  # how many next calls wait for ``hold``
        self.applied = asyncio.Event()
        self.sent: list[str] = []

    async def health(self) -> bool:
        return True

    async def loras_report(self) -> dict[str, Any]:
        return {"loras": [], "residency": {"cpu": [], "gpu": [], "pinned": [], "bytes": {},
                                           "eviction": {"policy": self.policy}}}

    async def metrics_text(self) -> str:
        raise EngineError(503, "engine_unavailable", "no metrics here")

    async def set_eviction_policy(self, policy: str) -> dict[str, Any]:
        self.policy = policy
        self.sent.append(policy)
        self.applied.set()
        if self.holding:
            self.holding -= 1
            await self.hold.wait()
        return {"policy": policy}


def _agent(tmp_path: Path, engine: _Engine, policy: str) -> NodeAgent:
    settings = _settings(tmp_path, eviction_policy=policy)
    return NodeAgent(settings, AdapterCache(settings.cache_dir), engine)  # type: ignore[arg-type]


def test_a_state_read_during_a_policy_switch_does_not_undo_it_in_the_engine(tmp_path: Path) -> None:
    """The engine has applied the new policy but its answer is not back; a heartbeat's state read then sees engine
    (new) != agent (old) and sent the old one back: the agent ended on ``lfu`` and the engine on ``lru``."""

    async def scenario() -> tuple[str, str]:
        engine = _Engine("lru")
        agent = _agent(tmp_path, engine, "lru")
        engine.holding = 1
        switching = asyncio.create_task(agent.set_eviction_policy("lfu"))
        await engine.applied.wait()
        reading = asyncio.create_task(agent.state())
        await asyncio.sleep(0.05)  # the state read runs as far as it can
        engine.hold.set()
        assert await switching == {"policy": "lfu"}
        await reading
        return agent.evictor.config.policy.value, engine.policy

    assert asyncio.run(scenario()) == ("lfu", "lfu")


def test_concurrent_policy_switches_leave_agent_and_engine_on_the_same_one(tmp_path: Path) -> None:
    async def scenario() -> tuple[str, str, list[str]]:
        engine = _Engine("lfu")
        agent = _agent(tmp_path, engine, "lfu")
        engine.holding = 1
        first = asyncio.create_task(agent.set_eviction_policy("lru"))
        await engine.applied.wait()
        second = asyncio.create_task(agent.set_eviction_policy("cost"))
        await asyncio.sleep(0.05)
        engine.hold.set()
        await asyncio.gather(first, second)
        return agent.evictor.config.policy.value, engine.policy, engine.sent

    agent_policy, engine_policy, sent = asyncio.run(scenario())
    assert agent_policy == engine_policy == sent[-1]


@pytest.mark.parametrize("body", [{"policy": None}, {"policy": ["lfu"]}, {"policy": 1}, {"policy": "LFU"},
                                  {"policy": "lfu\u0000"}, {"policy": "ｌｆｕ"}, {"policy": "x" * 10_000}, {}, [],
                                  "lfu"])
def test_bad_policy_bodies_are_400_and_change_nothing(tmp_path: Path, body: Any) -> None:
    engine = _Engine("lfu")
    app = create_app(_settings(tmp_path))
    app.state.agent = _agent(tmp_path, engine, "lfu")
    headers = {"content-type": "application/json", "Authorization": f"Bearer {KEY}"}

    status, answer, _ = asyncio.run(_post(app, "/v1/eviction_policy", [json.dumps(body).encode()], headers))

    assert status == 400, answer
    assert answer["code"] in ("invalid_request", "invalid_policy")
    assert "policy" in answer["detail"] or answer["code"] == "invalid_request"
    assert engine.sent == [] and app.state.agent.evictor.config.policy.value == "lfu"
