"""The node agent against the real engine and a real S3 (SeaweedFS, or the one in `AWS_S3_ENDPOINT_URL`)."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from inference.node.agent import create_app
from inference.node.config import NodeSettings
from inference.policy.node_eviction import GRACE_BUSY_S
from tests.fixtures.s3 import S3Server
from tests.fixtures.vllm import RunningEngine, free_port

Upload = Callable[[Path], list[dict[str, Any]]]


@pytest.fixture
def settings(clean_vllm_engine: RunningEngine, s3_server: S3Server, tmp_path: Path) -> NodeSettings:
    return NodeSettings(
        node_name="node-test",
        node_key=clean_vllm_engine.api_key,
        node_token="qvn_node-test.heartbeat-token",
        engine_url=clean_vllm_engine.url,
        base_model=clean_vllm_engine.served_model_name,
        cache_dir=tmp_path / "cache",
        agent_url="http://127.0.0.1:9/agent",
        s3_endpoint_url=s3_server.endpoint_url,
        control_url=None,
        heartbeat_seconds=5.0,
        max_loras=clean_vllm_engine.max_loras,
        max_cpu_loras=clean_vllm_engine.max_cpu_loras,
        max_lora_rank=clean_vllm_engine.max_lora_rank,
        eviction_grace_s=0.0,  # these tests load back to back and name the policy's victim
    )


@pytest.fixture
def agent(settings: NodeSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {settings.node_key}"
        yield client


@pytest.fixture
def upload(s3_server: S3Server) -> Upload:
    """Upload an adapter folder's files under a fresh prefix; return the contract's `files` list, each with a presigned
    GET as the control plane sends it (the agent holds no S3 credential)."""
    client = s3_server.client()

    def do(folder: Path) -> list[dict[str, Any]]:
        prefix = f"adapters/test-{uuid.uuid4().hex}/"
        files = []
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            data = (folder / name).read_bytes()
            client.put_object(Bucket=s3_server.bucket, Key=prefix + name, Body=data)
            files.append(
                {
                    "name": name,
                    "s3_key": prefix + name,
                    "url": _presign(client, s3_server.bucket, prefix + name),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                }
            )
        return files

    return do


def _presign(client: Any, bucket: str, key: str) -> str:
    return client.generate_presigned_url("get_object", ExpiresIn=300, Params={"Bucket": bucket, "Key": key})


def _state_adapters(agent: TestClient) -> list[dict[str, Any]]:
    """The state's adapters without their sizes (checked where they matter)."""
    response = agent.get("/v1/state")
    assert response.status_code == 200
    adapters = response.json()["adapters"]
    assert all(isinstance(a["bytes"], int) and a["bytes"] >= 0 for a in adapters)
    return [{k: v for k, v in a.items() if k not in ("bytes", "loads", "effect")} for a in adapters]


def test_load_stages_verified_files_and_serves_the_adapter(
    agent: TestClient,
    upload: Upload,
    tiny_adapters: dict[str, Path],
    settings: NodeSettings,
    clean_vllm_engine: RunningEngine,
) -> None:
    files = upload(tiny_adapters["qv-r8"])

    response = agent.post(
        "/v1/adapters/load", json={"lora_name": "acme--bot", "lora_int_id": 31, "files": files}
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert {k: body[k] for k in ("lora_name", "lora_int_id", "tier", "pinned")} == {
        "lora_name": "acme--bot",
        "lora_int_id": 31,
        "tier": "hot",  # the engine's own lists: add_lora (and the effect probe) put it in a GPU slot
        "pinned": False,
    }
    assert body["effect"] == "changed" and body["evicted"] == []
    assert body["download_ms"] > 0 and body["load_ms"] > 0
    staged = settings.cache_dir / "acme--bot" / "31"
    for spec in files:
        assert hashlib.sha256((staged / spec["name"]).read_bytes()).hexdigest() == spec["sha256"]
    completion = httpx.post(
        clean_vllm_engine.url + "/v1/completions",
        json={"model": "acme--bot", "prompt": "the cat", "max_tokens": 3},
        headers=clean_vllm_engine.headers,
    )
    assert completion.status_code == 200
    # The request activated it: it now sits in a GPU slot (the engine's own lists, not request activity).
    assert _state_adapters(agent) == [
        {"lora_name": "acme--bot", "lora_int_id": 31, "tier": "hot", "pinned": False, "served": True}
    ]
    assert agent.get("/v1/state").json()["adapters"][0]["bytes"] > 0


def test_load_is_idempotent_and_reuses_the_disk_copy(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], s3_server: S3Server
) -> None:
    files = upload(tiny_adapters["qv-r8"])
    request = {"lora_name": "acme--idem", "lora_int_id": 32, "files": files, "pin": True}
    first = agent.post("/v1/adapters/load", json=request)
    for spec in files:  # a second download would now fail with s3_object_missing
        s3_server.client().delete_object(Bucket=s3_server.bucket, Key=spec["s3_key"])

    second = agent.post("/v1/adapters/load", json=request)

    assert first.status_code == 200 and second.status_code == 200, second.text
    assert set(second.json()) == {"lora_name", "lora_int_id", "tier", "pinned", "download_ms", "load_ms", "effect",
                                  "evicted"}
    assert second.json()["pinned"] is True
    assert _state_adapters(agent) == [
        {"lora_name": "acme--idem", "lora_int_id": 32, "tier": "hot", "pinned": True, "served": True}
    ]


def test_sha256_mismatch_deletes_the_download_and_loads_nothing(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], settings: NodeSettings
) -> None:
    files = upload(tiny_adapters["qv-r8"])
    files[1]["sha256"] = "0" * 64

    response = agent.post(
        "/v1/adapters/load", json={"lora_name": "acme--bad", "lora_int_id": 33, "files": files}
    )

    assert response.status_code == 422
    assert response.json()["code"] == "sha256_mismatch"
    folder = settings.cache_dir / "acme--bad" / "33"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json"]  # no bad file, no temp file
    assert _state_adapters(agent) == [{"lora_name": "acme--bad", "lora_int_id": 33, "tier": "errored",
                                       "pinned": False, "served": False, "error_code": "sha256_mismatch"}]


def test_missing_s3_object(agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path],
                           s3_server: S3Server) -> None:
    files = upload(tiny_adapters["qv-r8"])
    files[0]["s3_key"] = "adapters/does-not-exist/adapter_config.json"
    files[0]["url"] = _presign(s3_server.client(), s3_server.bucket, files[0]["s3_key"])

    response = agent.post(
        "/v1/adapters/load", json={"lora_name": "acme--miss", "lora_int_id": 34, "files": files}
    )

    assert (response.status_code, response.json()["code"]) == (404, "s3_object_missing")


def test_engine_rejection_is_engine_load_failed(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], tmp_path: Path
) -> None:
    # r=32 > the engine's max_lora_rank 16.
    config = json.loads((tiny_adapters["qv-r8"] / "adapter_config.json").read_text())
    folder = tmp_path / "too-big"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    (folder / "adapter_model.safetensors").write_bytes(
        (tiny_adapters["qv-r8"] / "adapter_model.safetensors").read_bytes()
    )

    response = agent.post(
        "/v1/adapters/load", json={"lora_name": "acme--big", "lora_int_id": 35, "files": upload(folder)}
    )

    assert (response.status_code, response.json()["code"]) == (422, "engine_load_failed")


def test_unload_keeps_the_disk_copy_and_pin(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], settings: NodeSettings
) -> None:
    files = upload(tiny_adapters["all-r16"])
    assert (
        agent.post(
            "/v1/adapters/load", json={"lora_name": "acme--u", "lora_int_id": 36, "files": files}
        ).status_code
        == 200
    )
    pinned = agent.post("/v1/adapters/pin", json={"lora_name": "acme--u"})
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert _state_adapters(agent)[0]["pinned"] is True

    unloaded = agent.post("/v1/adapters/unload", json={"lora_name": "acme--u"})

    assert unloaded.status_code == 200 and unloaded.json() == {"lora_name": "acme--u", "tier": "staged"}
    assert _state_adapters(agent) == [
        {"lora_name": "acme--u", "lora_int_id": 36, "tier": "staged", "pinned": False, "served": False}
    ]
    assert (settings.cache_dir / "acme--u" / "36" / "adapter_model.safetensors").exists()
    assert agent.post("/v1/adapters/unload", json={"lora_name": "acme--u"}).status_code == 200  # idempotent
    unknown = agent.post("/v1/adapters/unload", json={"lora_name": "acme--never"})
    assert (unknown.status_code, unknown.json()["code"]) == (404, "lora_not_found")
    assert agent.post("/v1/adapters/pin", json={"lora_name": "acme--u"}).status_code == 404
    purged = agent.post("/v1/adapters/unload", json={"lora_name": "acme--u", "purge": True})
    assert purged.json() == {"lora_name": "acme--u", "tier": "cold"}
    assert not (settings.cache_dir / "acme--u").exists() and _state_adapters(agent) == []


def test_new_version_under_the_same_name_swaps_ids(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path]
) -> None:
    v1 = upload(tiny_adapters["qv-r8"])
    v2 = upload(tiny_adapters["all-r16"])
    assert (
        agent.post(
            "/v1/adapters/load", json={"lora_name": "acme--v", "lora_int_id": 41, "files": v1}
        ).status_code
        == 200
    )

    swapped = agent.post("/v1/adapters/load", json={"lora_name": "acme--v", "lora_int_id": 42, "files": v2})

    assert swapped.status_code == 200 and swapped.json()["lora_int_id"] == 42
    assert _state_adapters(agent) == [
        {"lora_name": "acme--v", "lora_int_id": 41, "tier": "staged", "pinned": False, "served": False},
        {"lora_name": "acme--v", "lora_int_id": 42, "tier": "hot", "pinned": False, "served": True},
    ]


def test_state_reports_node_and_engine_figures_and_hot_adapters(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    files = upload(tiny_adapters["qv-r8"])
    assert (
        agent.post(
            "/v1/adapters/load", json={"lora_name": "acme--hot", "lora_int_id": 51, "files": files}
        ).status_code
        == 200
    )
    # A long request keeps the adapter in the running batch while we poll the state.
    long_request = threading.Thread(
        target=httpx.post,
        args=(clean_vllm_engine.url + "/v1/completions",),
        kwargs={
            "json": {"model": "acme--hot", "prompt": "the", "max_tokens": 400, "ignore_eos": True},
            "headers": clean_vllm_engine.headers,
            "timeout": 120,
        },
    )
    long_request.start()
    seen_hot = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and seen_hot is None:
        state = agent.get("/v1/state").json()
        if state["adapters"] and state["adapters"][0]["tier"] == "hot" and state["num_requests_running"]:
            seen_hot = state
        time.sleep(0.1)
    long_request.join()

    assert seen_hot is not None
    assert seen_hot["num_requests_running"] >= 1
    assert {k: seen_hot[k] for k in ("node", "healthy", "base_model", "engine_url", "agent_url")} == {
        "node": "node-test",
        "healthy": True,
        "base_model": "tiny-llama",
        "engine_url": clean_vllm_engine.url,
        "agent_url": "http://127.0.0.1:9/agent",
    }
    assert (seen_hot["max_loras"], seen_hot["max_cpu_loras"], seen_hot["max_lora_rank"]) == (2, 4, 16)
    assert 0.0 < seen_hot["kv_cache_usage_perc"] <= 1.0
    assert isinstance(seen_hot["num_requests_waiting"], int)
    assert isinstance(seen_hot["num_preemptions_total"], float)


def test_every_route_but_healthz_needs_the_node_key(agent: TestClient) -> None:
    no_key = {"Authorization": ""}
    wrong = {"Authorization": "Bearer wrong"}

    assert agent.get("/healthz", headers=no_key).json() == {"status": "ok"}
    for method, path in (
        ("GET", "/v1/state"),
        ("POST", "/v1/adapters/load"),
        ("POST", "/v1/adapters/unload"),
        ("POST", "/v1/adapters/pin"),
        ("POST", "/v1/eviction_policy"),
    ):
        for headers in (no_key, wrong):
            response = agent.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (method, path)
            assert response.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    "change",
    [
        {"lora_int_id": 0},
        {"lora_name": "../etc"},
        {"files": []},
        {"files": [{"name": "../x", "s3_key": "k", "url": "http://s3/k", "sha256": "a" * 64, "size": 1}]},
        {"files": [{"name": "x", "s3_key": "k", "url": "http://s3/k", "sha256": "XYZ", "size": 1}]},
        # No presigned URL (the node has no S3 credential to fall back on), or one off the node's S3 endpoint.
        {"files": [{"name": "x", "s3_key": "k", "sha256": "a" * 64, "size": 1}]},
        {"files": [{"name": "x", "s3_key": "k", "url": "http://169.254.169.254/latest/meta-data/", "sha256": "a" * 64,
                    "size": 1}]},
        {"files": [{"name": "x", "s3_key": "k", "url": "http://127.0.0.1:+1/x", "sha256": "a" * 64, "size": 1}]},
    ],
)
def test_invalid_load_bodies(agent: TestClient, change: dict[str, Any], settings: NodeSettings) -> None:
    body = {
        "lora_name": "acme--x",
        "lora_int_id": 1,
        "files": [{"name": "adapter_config.json", "s3_key": "k", "url": "http://s3/k", "sha256": "a" * 64, "size": 1}],
        **change,
    }

    response = agent.post("/v1/adapters/load", json=body)

    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")
    assert not (settings.cache_dir.parent / "etc").exists()
    # A refused request is not a failed load: reported as errored, "../etc" made the control plane refuse every later
    # heartbeat of the node (attack round).
    assert _state_adapters(agent) == []


def test_a_load_refused_for_an_id_already_served_leaves_no_errored_entry(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path]
) -> None:
    files = upload(tiny_adapters["qv-r8"])  # ids of their own: the engine keeps step counts per id across tests
    assert agent.post("/v1/adapters/load", json={"lora_name": "acme--one", "lora_int_id": 171,
                                                 "files": files}).status_code == 200
    clash = agent.post("/v1/adapters/load", json={"lora_name": "acme--dup", "lora_int_id": 171, "files": files})
    assert (clash.status_code, clash.json()["code"]) == (409, "lora_int_id_conflict"), clash.text
    assert [(a["lora_name"], a["lora_int_id"]) for a in _state_adapters(agent)] == [("acme--one", 171)]


def test_a_stale_copy_of_an_id_the_engine_does_not_serve_gives_way_to_the_load(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], settings: NodeSettings
) -> None:
    """A node disk that outlived its control plane's database holds an id under a name that meant another version;
    the engine does not serve it, so it is deleted and the load goes on (every such load failed 409 in a fleet_scale
    rerun over the same node disks)."""
    stale = settings.cache_dir / "old--gone" / "172"
    stale.mkdir(parents=True)
    (stale / "adapter_config.json").write_text("{}")
    (stale / ".complete").write_text("")
    files = upload(tiny_adapters["qv-r8"])
    load = agent.post("/v1/adapters/load", json={"lora_name": "acme--new", "lora_int_id": 172, "files": files})
    assert load.status_code == 200, load.text
    assert not stale.exists()
    assert [(a["lora_name"], a["lora_int_id"]) for a in _state_adapters(agent)] == [("acme--new", 172)]


class _Recorder(BaseHTTPRequestHandler):
    received: list[tuple[str, str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Recorder.received.append((self.path, self.headers.get("Authorization", ""), body))
        answer = json.dumps({"node": body["node"], "healthy": True, "elsewhere": [7, "x", True],
                             "over_quota": [8]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        return


def test_heartbeat_posts_state_with_the_node_token(settings: NodeSettings) -> None:
    _Recorder.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    control = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with TestClient(create_app(replace(settings, control_url=control, heartbeat_seconds=0.2))) as client:
            deadline = time.monotonic() + 15
            while len(_Recorder.received) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            noted = client.app.state.agent.evictor._hints[1:]
    finally:
        server.shutdown()

    assert noted == ({7}, {8})  # the answer's hints (plan, quota) reached the agent; non-ints dropped

    assert len(_Recorder.received) >= 2
    path, auth, body = _Recorder.received[0]
    assert path == "/internal/v1/nodes/heartbeat"
    assert auth == f"Bearer {settings.node_token}"  # its own heartbeat token, not the key the engine accepts
    assert body["node"] == "node-test" and body["healthy"] is True and body["adapters"] == []


class _Failures(logging.Handler):
    """Counts the heartbeat loop's ``heartbeat.failed`` records (one per heartbeat the control plane never got)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage() == "heartbeat.failed"


def test_unreachable_control_plane_and_engine_are_not_fatal(settings: NodeSettings) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    app = create_app(replace(settings, control_url=dead, heartbeat_seconds=0.1, engine_url=dead))
    failed = _Failures()
    logging.getLogger("inference.node.heartbeat").addHandler(failed)
    try:
        with TestClient(app) as client:
            deadline = time.monotonic() + 30
            while failed.count < 3:  # several heartbeats failed, and the agent still answers
                assert time.monotonic() < deadline, f"{failed.count} failed heartbeats in 30 s"
                time.sleep(0.05)
            health = client.get("/healthz")
            state = client.get("/v1/state", headers={"Authorization": f"Bearer {settings.node_key}"})
    finally:
        logging.getLogger("inference.node.heartbeat").removeHandler(failed)

    assert (health.status_code, health.json()["code"]) == (503, "engine_unavailable")
    assert state.status_code == 200
    assert state.json()["healthy"] is False
    assert state.json()["kv_cache_usage_perc"] is None and state.json()["num_requests_running"] is None


def _loader(client: TestClient, prefix: str, first_id: int, files: list[dict[str, Any]]) -> Callable[[int], Any]:
    """``load(i)``: load ``acme--{prefix}{i}`` as ``lora_int_id`` ``first_id + i`` through ``client``; its answer."""
    def load(i: int) -> dict[str, Any]:
        answer = client.post("/v1/adapters/load", json={"lora_name": f"acme--{prefix}{i}",
                                                       "lora_int_id": first_id + i, "files": files})
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]
    return load


def _use(engine: RunningEngine, model: str, times: int) -> None:
    """Run ``times`` 8-token completions of ``model`` straight on the engine (scheduler steps for LFU)."""
    for _ in range(times):
        done = httpx.post(engine.url + "/v1/completions", headers=engine.headers,
                          json={"model": model, "prompt": "the", "max_tokens": 8, "ignore_eos": True}, timeout=120)
        assert done.status_code == 200


def test_a_full_cpu_cache_loses_the_adapter_the_policy_picks(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    """QUIVER_EVICTION_POLICY=lfu (the default): the busiest adapter stays though it is the least recently used;
    vLLM's own LRU would have dropped it."""
    files = upload(tiny_adapters["qv-r8"])
    capacity = clean_vllm_engine.max_cpu_loras

    load = _loader(agent, "lfu", 70, files)
    load(0)
    _use(clean_vllm_engine, "acme--lfu0", 4)  # lfu0 is busy, then the least recently used once the others load
    answers = [load(i) for i in range(1, capacity)]
    assert all(a["evicted"] == [] for a in answers)  # room was left

    newcomer = load(capacity)

    assert newcomer["evicted"] == ["acme--lfu1"]  # fewest steps; ties broken by recency
    tiers = {a["lora_name"]: (a["tier"], a["served"]) for a in _state_adapters(agent)}
    assert tiers["acme--lfu0"][1] is True and tiers["acme--lfu0"][0] in ("hot", "warm")
    assert tiers["acme--lfu1"] == ("staged", True)  # out of the engine's cache, still served by name
    state = agent.get("/v1/state").json()
    residency = state["residency"]
    assert {k: residency[k] for k in ("source", "gpu", "cpu", "disk", "errored", "pinned")} == {
        "source": "engine", "gpu": clean_vllm_engine.max_loras, "cpu": capacity - clean_vllm_engine.max_loras,
        "disk": 1, "errored": 0, "pinned": 0}
    assert residency["cpu_bytes"] > 0 and residency["disk_bytes"] > 0 and residency["gpu_slot_bytes"] > 0
    loads = {a["lora_name"]: a["loads"] for a in state["adapters"] if a["served"]}
    assert loads == {f"acme--lfu{i}": 1 for i in range(capacity + 1)}  # the engine's own load counts
    scrape = agent.get("/metrics", headers={"Authorization": ""})  # Prometheus needs no node key: aggregates only
    assert scrape.status_code == 200
    assert f'quiver_node_lora_adapters{{tier="gpu"}} {float(clean_vllm_engine.max_loras)}' in scrape.text
    # A gateway whose view is a heartbeat old may still route here: the engine reloads it from disk, no 404.
    _use(clean_vllm_engine, "acme--lfu1", 1)
    assert {a["lora_name"]: a["tier"] for a in _state_adapters(agent)}["acme--lfu1"] in ("hot", "warm")


def test_lru_policy_drops_the_least_recently_used(
    settings: NodeSettings, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    files = upload(tiny_adapters["qv-r8"])
    with TestClient(create_app(replace(settings, eviction_policy="lru"))) as client:
        client.headers["Authorization"] = f"Bearer {settings.node_key}"
        answers = [client.post("/v1/adapters/load", json={"lora_name": f"acme--lru{i}", "lora_int_id": 80 + i,
                                                           "files": files}).json()
                   for i in range(clean_vllm_engine.max_cpu_loras + 1)]
    assert answers[-1]["evicted"] == ["acme--lru0"]


def test_a_just_loaded_adapter_is_not_the_victim_while_an_older_one_can_go(
    settings: NodeSettings, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    """LRU alone would drop grace1 (its effect probe is its only use); inside the grace, grace0 goes instead: its
    request has run, which ends its grace. When every resident is fresh, the policy picks among them all."""
    files = upload(tiny_adapters["qv-r8"])
    capacity = clean_vllm_engine.max_cpu_loras
    with TestClient(create_app(replace(settings, eviction_policy="lru", eviction_grace_s=600.0))) as client:
        client.headers["Authorization"] = f"Bearer {settings.node_key}"

        load = _loader(client, "grace", 90, files)
        assert all(load(i)["evicted"] == [] for i in range(capacity))
        done = httpx.post(clean_vllm_engine.url + "/v1/completions", headers=clean_vllm_engine.headers,
                          json={"model": "acme--grace0", "prompt": "the", "max_tokens": 2}, timeout=120)
        assert done.status_code == 200
        agent = client.app.state.agent
        assert set(agent.evictor._requests_at_load) == {90 + i for i in range(capacity)}  # baselines after each probe
        _wait_idle(clean_vllm_engine, 90, GRACE_BUSY_S)  # its request is done, not just started

        assert load(capacity)["evicted"] == ["acme--grace0"]
        assert load(capacity + 1)["evicted"] == ["acme--grace1"]  # all fresh: LRU among them


def test_an_idle_adapter_the_plan_put_elsewhere_goes_before_the_policys_pick(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LFU would keep the busy away0; the heartbeat answer says the plan moved it to another node, so it goes."""
    monkeypatch.setattr("inference.policy.node_eviction.ELSEWHERE_IDLE_S", 0.0)
    files = upload(tiny_adapters["qv-r8"])
    capacity = clean_vllm_engine.max_cpu_loras

    load = _loader(agent, "away", 110, files)
    assert all(load(i)["evicted"] == [] for i in range(capacity))
    _use(clean_vllm_engine, "acme--away0", 3)
    agent.app.state.agent.note_plan({"elsewhere": [110, 999]})  # type: ignore[attr-defined]

    assert load(capacity)["evicted"] == ["acme--away0"]


def test_the_control_planes_hints_expire() -> None:
    from types import SimpleNamespace

    from inference.node.eviction import Evictor
    from inference.policy.node_eviction import HINTS_STALE_HEARTBEATS

    fake = SimpleNamespace(settings=SimpleNamespace(heartbeat_seconds=5.0),
                           _hints=(1000.0, frozenset({1, 2}), frozenset({3})))
    assert Evictor.hints(fake, 1001.0) == ({1, 2}, {3})  # type: ignore[arg-type]
    assert Evictor.hints(fake, 1000.0 + HINTS_STALE_HEARTBEATS * 5 + 1) == (set(), set())  # type: ignore[arg-type]


def _wait_idle(engine: RunningEngine, lora_int_id: int, idle_s: float, timeout_s: float = 60.0) -> None:
    """Poll the engine's own report until ``lora_int_id`` has been out of every batch for ``idle_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = httpx.get(engine.url + "/quiver/v1/loras", headers=engine.headers, timeout=30).json()
        if float(report["residency"]["idle_s"].get(str(lora_int_id), 0.0)) >= idle_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"{lora_int_id} still in a batch after {timeout_s} s")


def test_the_effect_probe_refuses_an_adapter_that_changes_nothing(
    agent: TestClient, upload: Upload, no_effect_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    """B @ A == 0 with no all-zero tensor: validation cannot see it; the probe does, and the load fails."""
    body = {"lora_name": "acme--noop", "lora_int_id": 91, "files": upload(no_effect_adapters["cancel"])}

    refused = agent.post("/v1/adapters/load", json=body)

    assert (refused.status_code, refused.json()["code"]) == (422, "no_effect"), refused.text
    errored = [a for a in agent.get("/v1/state").json()["adapters"] if a["lora_name"] == "acme--noop"]
    assert [(a["tier"], a["error_code"], a["served"]) for a in errored] == [("errored", "no_effect", False)]
    gone = httpx.post(clean_vllm_engine.url + "/v1/completions", headers=clean_vllm_engine.headers,
                      json={"model": "acme--noop", "prompt": "the", "max_tokens": 2}, timeout=120)
    assert gone.status_code == 404  # never served as the base model in silence


def test_a_known_untrained_adapter_is_served_with_its_verdict(
    agent: TestClient, upload: Upload, no_effect_adapters: dict[str, Path]
) -> None:
    """Validation already warned (``adapter_untrained``): the control plane sends ``expect_effect: false``."""
    body = {"lora_name": "acme--zero", "lora_int_id": 92, "files": upload(no_effect_adapters["zero_b"]),
            "expect_effect": False}

    served = agent.post("/v1/adapters/load", json=body)

    assert served.status_code == 200 and served.json()["effect"] == "no_effect", served.text
    (entry,) = [a for a in agent.get("/v1/state").json()["adapters"] if a["lora_name"] == "acme--zero"]
    assert (entry["tier"], entry["served"], entry["effect"]) == ("hot", True, "no_effect")


def test_failed_load_is_reported_errored_until_a_good_load(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], tmp_path: Path
) -> None:
    config = json.loads((tiny_adapters["qv-r8"] / "adapter_config.json").read_text())
    folder = tmp_path / "too-big"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    (folder / "adapter_model.safetensors").write_bytes(
        (tiny_adapters["qv-r8"] / "adapter_model.safetensors").read_bytes()
    )
    bad = agent.post("/v1/adapters/load", json={"lora_name": "acme--err", "lora_int_id": 61, "files": upload(folder)})
    assert bad.status_code == 422

    state = agent.get("/v1/state").json()
    errored = [a for a in state["adapters"] if a["lora_name"] == "acme--err"]
    assert [(a["tier"], a["error_code"]) for a in errored] == [("errored", "engine_load_failed")]
    assert state["residency"]["errored"] == 1

    good = agent.post("/v1/adapters/load",
                      json={"lora_name": "acme--err", "lora_int_id": 62, "files": upload(tiny_adapters["qv-r8"])})
    assert good.status_code == 200
    tiers = {(a["lora_int_id"], a["tier"]) for a in _state_adapters(agent) if a["lora_name"] == "acme--err"}
    assert (62, "hot") in tiers and not any(t == "errored" for _, t in tiers)


def test_a_reload_of_the_same_weights_reuses_the_effect_verdict(
    agent: TestClient, upload: Upload, tiny_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evicted then requested again (``unload`` stands in for the eviction): the weights' sha256s are unchanged, so
    the reload answers the first load's verdict without the probe's two greedy requests."""
    node_agent = agent.app.state.agent  # type: ignore[attr-defined]
    probed: list[str] = []
    real_probe = node_agent.effect_probe.probe

    async def counting_probe(lora_name: str) -> str:
        probed.append(lora_name)
        return await real_probe(lora_name)

    monkeypatch.setattr(node_agent.effect_probe, "probe", counting_probe)
    body = {"lora_name": "acme--again", "lora_int_id": 93, "files": upload(tiny_adapters["qv-r8"])}

    first = agent.post("/v1/adapters/load", json=body)
    assert agent.post("/v1/adapters/unload", json={"lora_name": "acme--again"}).status_code == 200
    second = agent.post("/v1/adapters/load", json=body)
    other = agent.post("/v1/adapters/load", json={"lora_name": "acme--other", "lora_int_id": 94,
                                                  "files": upload(tiny_adapters["all-r16"])})

    assert [r.status_code for r in (first, second, other)] == [200, 200, 200], (first.text, second.text, other.text)
    assert (first.json()["effect"], second.json()["effect"]) == ("changed", "changed")
    assert probed == ["acme--again", "acme--other"]  # other weights are probed


def test_the_disk_budget_stops_serving_an_evicted_name_before_deleting_its_files(
    settings: NodeSettings, upload: Upload, tiny_adapters: dict[str, Path], clean_vllm_engine: RunningEngine
) -> None:
    """An adapter evicted to make room stays served by name (the engine would reload it from disk); when the disk
    budget then deletes its files, its name goes first, so the engine answers 404 (the gateway re-routes) instead of
    failing to load from a deleted path."""
    files = upload(tiny_adapters["qv-r8"])
    size = sum(int(f["size"]) for f in files)
    capacity = clean_vllm_engine.max_cpu_loras
    budget = size * capacity + size // 2  # the engine's cache fits; one more version on disk does not
    with TestClient(create_app(replace(settings, eviction_policy="lru", cache_max_bytes=budget))) as client:
        client.headers["Authorization"] = f"Bearer {settings.node_key}"
        load = _loader(client, "disk", 130, files)
        assert all(load(i)["evicted"] == [] for i in range(capacity))

        assert load(capacity)["evicted"] == ["acme--disk0"]

        served = {a["lora_name"] for a in _state_adapters(client) if a["served"]}
        staged = {e.lora_name for e in client.app.state.agent.cache.staged()}  # type: ignore[attr-defined]
    assert "acme--disk0" not in served and "acme--disk0" not in staged
    assert served == staged == {f"acme--disk{i}" for i in range(1, capacity + 1)}
    gone = httpx.post(clean_vllm_engine.url + "/v1/completions", headers=clean_vllm_engine.headers,
                      json={"model": "acme--disk0", "prompt": "the", "max_tokens": 2}, timeout=120)
    assert gone.status_code == 404


def _engine_policy(engine: RunningEngine) -> str:
    listing = httpx.get(engine.url + "/quiver/v1/loras", headers=engine.headers, timeout=30).json()
    return str(listing["residency"]["eviction"]["policy"])


def test_the_agent_sets_the_engines_eviction_policy(
    settings: NodeSettings, clean_vllm_engine: RunningEngine
) -> None:
    """One setting for the node: the agent sends its policy to an engine that ranks by another (the engine's own
    environment's, or the default after a restart), and an operator can switch both at run time."""
    assert _engine_policy(clean_vllm_engine) == "lfu"  # the engine's environment sets none: the default
    try:
        with TestClient(create_app(replace(settings, eviction_policy="lru"))) as client:
            client.headers["Authorization"] = f"Bearer {settings.node_key}"
            assert client.get("/v1/state").json()["residency"]["source"] == "engine"
            assert _engine_policy(clean_vllm_engine) == "lru"  # sent with the first state read

            switched = client.post("/v1/eviction_policy", json={"policy": "cost"})
            assert switched.status_code == 200 and switched.json() == {"policy": "cost"}
            assert _engine_policy(clean_vllm_engine) == "cost"
            client.get("/v1/state")
            assert _engine_policy(clean_vllm_engine) == "cost"  # the switch holds; the environment's value does not return

            refused = client.post("/v1/eviction_policy", json={"policy": "fifo"})
            assert (refused.status_code, refused.json()["code"]) == (400, "invalid_policy")
            assert "lru, lfu, cost" in refused.json()["detail"]
            assert _engine_policy(clean_vllm_engine) == "cost"
    finally:
        httpx.post(clean_vllm_engine.url + "/quiver/v1/eviction_policy", json={"policy": "lfu"},
                   headers=clean_vllm_engine.headers, timeout=30).raise_for_status()
