"""Issue 32 on real services: the `openai` SDK through the gateway on the session's vLLM CPU engine, two more gateway
processes, a real Celery worker and the node agent.

A new version of a served adapter changes nothing until promoted; ``name@N`` reaches each version; a rejected version
is a clean 404; promotion warms first (the engine's own load count shows the first request after it loads nothing);
rollback reaches two gateway processes within 1 s while streams of the old version finish and no request fails; a key
scoped to one adapter gets a 404 for another and its limits hold; per-version figures side by side. The 90/10 split
over 1,000 requests is measured without the engine (tests/adapters_app/test_serving.py, tests/inference/policy).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from demo.api_client import upload_adapter, wait_validated
from demo.assets import DemoAssets
from inference.fleet.models import Placement
from inference.fleet.node_keys import node_credentials
from inference.fleet.warming import placement_evict
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.stack import GatewayProcess, RunningAgent

pytestmark = pytest.mark.django_db(transaction=True)

SHORT = 3  # tokens of the quick probes
LONG = 40  # tokens of the streams in flight across the rollback
PROBE = 2  # tokens of the probes dating the rollback at each gateway process
PROBE_EVERY_S = 0.1
PROBE_WINDOW_S = 1.5


def _until(check, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s"
        time.sleep(0.1)


def _engine_loads(agent: RunningAgent, lora_name: str) -> tuple[int, str]:
    """The engine's own load count (every adapter, since it started: vLLM's disk → CPU loads, counted by
    ``inference.node.worker_ext``) and ``lora_name``'s tier ("" when the engine no longer lists it), from the agent."""
    key = node_credentials(agent.node_name, 1).key
    state = httpx.get(f"{agent.url}/v1/state", headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
    entry = next((a for a in state["adapters"] if a["lora_name"] == lora_name), {})
    return int(state["residency"]["loads_total"]), str(entry.get("tier", ""))


def _text(client: openai.OpenAI, model: str, prompt: str, n: int = SHORT, **extra: object) -> str:
    out = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0, **extra)  # type: ignore[call-overload]
    return out.choices[0].text


def test_versions_promote_canary_rollback_and_scoped_keys_live(  # type: ignore[no-untyped-def]
        demo_assets: DemoAssets, base_model, gateway_server: str, celery_worker: None, live_node, node_agent,
        gateway_processes: list[GatewayProcess], tmp_path: Path) -> None:
    tenant = TenantFactory(slug="lifecycle")
    _, key = api_key_create(tenant, name="app")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    client = openai.OpenAI(base_url=gateway_server + "/v1", api_key=key, max_retries=0, timeout=180)
    capitals = demo_assets.examples["capitals"][0]
    prompt = capitals["prompt"]

    # v1 = the capitals adapter: it serves at once (the adapter's first ready version).
    assert wait_validated(api, "bot", upload_adapter(api, "bot", demo_assets.adapters["capitals"],
                                                     base_model="tiny-llama")["number"])["status"] == "ready"
    v1_answer = _text(client, "bot", prompt, 12)
    assert v1_answer.strip() == capitals["completion"].strip()

    # v2 = the upper adapter, uploaded as the same adapter: ready, warmed, and it takes no traffic.
    assert wait_validated(api, "bot", upload_adapter(api, "bot", demo_assets.adapters["upper"],
                                                     base_model="tiny-llama")["number"])["status"] == "ready"
    v2 = AdapterVersion.objects.select_related("adapter__tenant").get(adapter__tenant=tenant, adapter__name="bot",
                                                                      number=2)
    assert _text(client, "bot@2", prompt, 12) != v1_answer  # distinguishable outputs
    assert _text(client, "bot@1", prompt, 12) == v1_answer
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: _text(client, "bot", prompt, 12), range(50)))
    assert answers == [v1_answer] * 50
    assert api.get("/api/v1/adapters/bot").json()["serving_version"] == 1

    # A rejected version (rank over the pool's limit) and unknown numbers are clean 404s.
    bad = tmp_path / "bad"
    shutil.copytree(demo_assets.adapters["capitals"], bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "r": 4096}))
    assert wait_validated(api, "bot", upload_adapter(api, "bot", bad, base_model="tiny-llama")["number"]
                          )["status"] == "rejected"
    for missing in ("bot@3", "bot@9", "bot@0"):
        with pytest.raises(openai.NotFoundError) as caught:
            _text(client, missing, prompt)
        assert caught.value.code == "model_not_found"

    # Promotion warms first: take v2 out of the engine, promote, and the first request after loads nothing.
    _until(lambda: Placement.objects.filter(adapter_version=v2, tier__in=["warm", "hot"]).exists(), "v2 warm")
    placement_evict(Placement.objects.select_related("node", "adapter_version__adapter__tenant").get(
        adapter_version=v2, node=live_node))
    _until(lambda: _engine_loads(node_agent, v2.served_name)[1] not in ("warm", "hot"), "v2 out of the engine")
    loads_before, _ = _engine_loads(node_agent, v2.served_name)
    promoted = api.post("/api/v1/adapters/bot/promote", json={"version": 2})
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["warm"] == {"2": "warm"} and promoted.json()["serving_since"]
    loads_warmed, tier = _engine_loads(node_agent, v2.served_name)
    assert loads_warmed == loads_before + 1 and tier in ("warm", "hot")
    # The rule reaches the gateway's cache over the bus right after the commit: poll until it answers from v2.
    _until(lambda: _text(client, "bot", prompt, 12) != v1_answer, "the promotion at the gateway", timeout=1.0)
    v2_answer = _text(client, "bot", prompt, 12)
    assert v2_answer == _text(client, "bot@2", prompt, 12)
    assert _engine_loads(node_agent, v2.served_name)[0] == loads_warmed  # not a cold load

    # Rollback while v2 streams and other requests are in flight, with two more gateway processes serving.
    v1_short = _text(client, "bot@1", prompt)
    v2_short = _text(client, "bot@2", prompt)
    v1_probe, v2_probe = _text(client, "bot@1", prompt, PROBE), _text(client, "bot@2", prompt, PROBE)
    assert v1_short != v2_short and v1_probe != v2_probe
    gw_clients = [openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=300)
                  for gw in gateway_processes]
    for gw_client in gw_clients:  # both processes have the v2 rule cached
        assert _text(gw_client, "bot", prompt) == v2_short

    streaming = threading.Semaphore(0)

    def stream(gw_client: openai.OpenAI) -> tuple[str, str | None]:
        parts, finish = [], None
        for chunk in gw_client.completions.create(model="bot", prompt=prompt, max_tokens=LONG, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices:
                if not parts:
                    streaming.release()
                parts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    stop = threading.Event()
    statuses: list[int] = []

    def steady() -> None:
        with httpx.Client(timeout=300) as http:
            while not stop.is_set():
                statuses.append(http.post(f"{gateway_processes[1].url}/v1/completions",
                                          headers={"Authorization": f"Bearer {key}"},
                                          json={"model": "bot", "prompt": prompt, "max_tokens": SHORT,
                                                "temperature": 0}).status_code)

    probes: list[tuple[int, float, str]] = []  # (gateway, monotonic time sent, answer)

    def probe(i: int) -> None:
        sent = time.monotonic()
        probes.append((i, sent, _text(gw_clients[i], "bot", prompt, PROBE)))

    # The gateway resolves `model` when a request arrives, before the engine's queue: a probe's send time dates
    # the rule it saw, however long the (busy, CPU) engine then takes. Probes leave every PROBE_EVERY_S to each
    # process, so the measure does not depend on the engine's latency.
    with ThreadPoolExecutor(max_workers=48) as pool:
        try:
            streams = [pool.submit(stream, gw_clients[i % 2]) for i in range(3)]
            background = pool.submit(steady)
            for _ in streams:
                assert streaming.acquire(timeout=300), "a stream never started"
            called = time.monotonic()
            rolled = api.post("/api/v1/adapters/bot/rollback")
            returned = time.monotonic()
            assert rolled.status_code == 200 and rolled.json()["rule"] == [{"version": 1, "weight": 100}]
            sent_probes = []
            tick = returned
            while tick < returned + PROBE_WINDOW_S:
                sent_probes += [pool.submit(probe, i) for i in range(len(gw_clients))]
                tick += PROBE_EVERY_S
                time.sleep(max(0.0, tick - time.monotonic()))  # the probes' pace, not a wait for the outcome
            for done in sent_probes:
                done.result()  # a probe that failed fails the test: no request fails across the switch
        finally:
            stop.set()
        background.result()
        finished = [f.result() for f in streams]
    assert {answer for _, _, answer in probes} <= {v1_probe, v2_probe}
    for i in range(len(gw_clients)):
        mine = sorted((sent - returned, answer) for g, sent, answer in probes if g == i)
        last_v2 = max((at for at, answer in mine if answer == v2_probe), default=float("-inf"))
        settled = [at for at, answer in mine if at > last_v2]
        assert settled and all(answer == v1_probe for at, answer in mine if at > last_v2)
        print(f"rollback at gateway {i}: the call took {returned - called:.3f} s; probes sent {last_v2:.3f} s after it "
              f"still saw v2, every probe from {settled[0]:.3f} s on saw v1")
        assert settled[0] < 1.0, (i, mine)
    assert statuses and set(statuses) == {200}, statuses
    for text, finish in finished:  # the old version's streams ran to the end, on the old version
        assert finish == "length" and text.startswith(v2_short)

    # A key scoped to `bot`: 404 for another adapter and its versions, its limits hold.
    side = adapter_create(tenant, name="side", base_model_name="tiny-llama")
    v1 = AdapterVersion.objects.get(adapter__tenant=tenant, adapter__name="bot", number=1)
    AdapterVersion.objects.create(tenant=tenant, adapter=side, number=1, sha256=v1.sha256, size_bytes=v1.size_bytes,
                                  s3_prefix=v1.s3_prefix, files=v1.files, status="ready")
    _, scoped = api_key_create(tenant, name="bot-only", adapters=["bot"], limits={"rpm_limit": 2})
    scoped_client = openai.OpenAI(base_url=gateway_server + "/v1", api_key=scoped, max_retries=0, timeout=180)
    assert "side" in {m.id for m in client.models.list().data}
    assert {m.id for m in scoped_client.models.list().data} == {"bot"}
    for refused in ("side", "side@1", "tiny-llama"):
        with pytest.raises(openai.NotFoundError) as caught:
            _text(scoped_client, refused, prompt)
        assert caught.value.code == "model_not_found"
    assert _text(scoped_client, "bot", prompt) == v1_short
    assert _text(scoped_client, "bot@2", prompt) == v2_short
    with pytest.raises(openai.RateLimitError):
        _text(scoped_client, "bot", prompt)

    # Per-version figures side by side (the canary view's API).
    rows = {r["version"]: r for r in api.get("/api/v1/usage/versions", params={"adapter": "bot"}).json()}
    assert rows[1]["weight"] == 100 and rows[2]["weight"] == 0
    assert rows[1]["requests"] >= 50 and rows[2]["requests"] >= 5
    # TTFT is metered for streams: v2 streamed across the rollback.
    assert rows[2]["ttft_ms_p50"] is not None and rows[1]["latency_ms_p95"] is not None
    history = api.get("/api/v1/adapters/bot/serving").json()["history"]
    assert [h["action"] for h in history[:3]] == ["rollback", "promote", "first_ready"]
    assert history[0]["actor"].startswith("key:")
