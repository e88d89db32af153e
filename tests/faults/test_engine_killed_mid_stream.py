"""Fault injection on real services: SIGKILL a vLLM engine mid-stream.

The client gets an OpenAI error event, the usage row says 502 with exactly the tokens that reached the client, the
node's next heartbeat marks it unhealthy, and the next request is served by the other node. The killed engine is
this module's own (one extra engine start); the session engine, beside ``test-node-1``, is the second node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from demo.assets import DemoAssets
from devtools.proc import free_port
from inference.fleet.models import Node
from inference.fleet.node_keys import node_credentials
from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain
from inference.node.launch import EngineConfig
from inference.policy.hrw import hrw_weight
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.stack import RunningAgent, agent_running, node_live
from tests.fixtures.vllm import TEST_NODE_NAME, TINY_SERVED_NAME, RunningEngine, engine_running

pytestmark = pytest.mark.django_db(transaction=True)
# Base-model requests tie on free slots and load between two idle nodes; HRW breaks the tie. The victim is named so
# that the production tie-breaker prefers it, which makes the first stream land on it deterministically.
VICTIM = next(name for i in range(100) if hrw_weight("base", name := f"fault-victim-{i}") > hrw_weight("base", TEST_NODE_NAME))


@pytest.fixture(scope="module")
def victim(demo_assets: DemoAssets, internal_server: str, tmp_path_factory: pytest.TempPathFactory,
           django_db_blocker: pytest.FixtureRequest) -> Iterator[tuple[RunningEngine, RunningAgent]]:
    """A second engine (small: 4 sequences) with its own agent as node ``VICTIM``; the test kills the engine."""
    config = dataclasses.replace(
        EngineConfig.cpu_dev(demo_assets.base_dir, TINY_SERVED_NAME, port=free_port(),
                             api_key=node_credentials(VICTIM).key), max_num_seqs=4)
    root = tmp_path_factory.mktemp("victim")
    (root / "cache").mkdir()
    try:
        with engine_running(config, root / "engine.log") as engine, \
                agent_running(engine, VICTIM, internal_server, root / "cache") as agent:
            yield engine, agent
    finally:
        with django_db_blocker.unblock():
            Node.objects.filter(name=VICTIM).delete()


def _wait(what: str, predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _usage(tenant: object, n: int) -> list[UsageRecord]:
    records = UsageRecord.objects.filter(tenant=tenant).order_by("created_at")
    deadline = time.monotonic() + 20
    while records.count() < n:
        assert time.monotonic() < deadline, list(records.values("status_code", "node__name"))
        usage_drain()
        time.sleep(0.1)
    return list(records)


def test_engine_killed_mid_stream(victim, node_agent, base_model, gateway_server: str) -> None:  # type: ignore[no-untyped-def]
    engine, victim_agent = victim
    victim_node = node_live(victim_agent, base_model)
    other = node_live(node_agent, base_model)
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "tiny-llama", "prompt": "the cat", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True, "logprobs": 1}

    received_tokens, events, killed = 0, [], False
    with httpx.stream("POST", f"{gateway_server}/v1/completions", json=body, headers=headers, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                events.append(payload)
                continue
            event = json.loads(payload)
            events.append(event)
            if event.get("choices"):
                received_tokens += len((event["choices"][0].get("logprobs") or {}).get("tokens") or ())
                if not killed:
                    # Freeze the engine first so it cannot finish the 400 tokens, then kill every process of it.
                    os.killpg(engine.pid, signal.SIGSTOP)
                    os.killpg(engine.pid, signal.SIGKILL)
                    killed = True
                    killed_at = time.monotonic()

    assert killed and 0 < received_tokens < 400, events[:3]
    assert "[DONE]" not in events
    assert events[-1] == {"error": {"message": "The inference node stopped mid-stream; the output is incomplete. "
                                               "Retry.", "type": "server_error", "param": None,
                                    "code": "upstream_stream_cut"}}
    # One heartbeat (1 s) plus the agent's engine probe: the node says it is unhealthy.
    _wait("victim still healthy", lambda: not Node.objects.get(pk=victim_node.pk).healthy, 5)
    assert time.monotonic() - killed_at < 5

    # New requests go to the other node, whatever this gateway's cached fleet view still says.
    for _ in range(3):
        again = httpx.post(f"{gateway_server}/v1/completions", headers=headers, timeout=60,
                           json={"model": "tiny-llama", "prompt": "the cat", "max_tokens": 4, "ignore_eos": True})
        assert again.status_code == 200, again.text

    cut, *after = _usage(tenant, 4)
    assert (cut.status_code, cut.stream, cut.node_id) == (502, True, victim_node.pk)
    assert cut.completion_tokens == received_tokens and cut.prompt_tokens > 0
    assert [(r.status_code, r.node_id, r.completion_tokens) for r in after] == [(200, other.pk, 4)] * 3
