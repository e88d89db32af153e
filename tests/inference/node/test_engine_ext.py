"""The vLLM engine as Quiver runs it: CPU LoRA fix plugin + `/quiver/v1/*` extension, against one real engine.

The mixed-batch test is the end-to-end check of the base-row fix (vllm-project/vllm PR #49656): base and
adapter requests share a batch and every output must equal transformers + PEFT token for token.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from peft import PeftModel

from demo.tiny_model import load_base
from inference.policy.engine_model import LoRAEngineModel
from inference.policy.node_eviction import GRACE_BUSY_S
from tests.fixtures.vllm import RunningEngine

PROMPTS = ["the red cat sees", "one big dog runs and", "a king reads the book", "blue river"]
MAX_TOKENS = 16


def _add(client: httpx.Client, name: str, lora_int_id: int, path: Path, **extra: object) -> httpx.Response:
    return client.post(
        "/quiver/v1/add_lora",
        json={"lora_name": name, "lora_int_id": lora_int_id, "lora_path": str(path), **extra},
    )


@pytest.fixture
def engine_http(clean_vllm_engine: RunningEngine) -> httpx.Client:
    with httpx.Client(
        base_url=clean_vllm_engine.url, headers=clean_vllm_engine.headers, timeout=60
    ) as client:
        yield client  # type: ignore[misc]


async def _complete_all(
    engine: RunningEngine, jobs: list[tuple[str, str]]
) -> list[tuple[list[int], list[int]]]:
    async def one(client: httpx.AsyncClient, model: str, prompt: str) -> tuple[list[int], list[int]]:
        response = await client.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        response.raise_for_status()
        choice = response.json()["choices"][0]
        return choice["prompt_token_ids"], choice["token_ids"]

    async with httpx.AsyncClient(base_url=engine.url, headers=engine.headers, timeout=120) as client:
        return await asyncio.gather(*(one(client, model, prompt) for model, prompt in jobs))


def _reference(model: torch.nn.Module, prompt_ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt_ids]),
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,  # = vLLM's ignore_eos
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


def test_mixed_batch_matches_transformers_and_peft(
    engine_http: httpx.Client, clean_vllm_engine: RunningEngine, tiny_adapters: dict[str, Path]
) -> None:
    names = {"t1--qv": ("qv-r8", 9101), "t2--all": ("all-r16", 9102)}
    for lora_name, (adapter, lora_int_id) in names.items():
        assert _add(engine_http, lora_name, lora_int_id, tiny_adapters[adapter]).status_code == 200
    base_name = clean_vllm_engine.served_model_name
    # 12 concurrent requests, interleaved base/adapter so the scheduler batches them together.
    jobs = [(model, prompt) for prompt in PROMPTS for model in (base_name, *names)]

    results = asyncio.run(_complete_all(clean_vllm_engine, jobs))

    references: dict[str, torch.nn.Module] = {base_name: load_base(clean_vllm_engine.model_dir)[0]}
    for lora_name, (adapter, _) in names.items():
        fresh_base, _ = load_base(clean_vllm_engine.model_dir)
        references[lora_name] = PeftModel.from_pretrained(fresh_base, str(tiny_adapters[adapter])).eval()
    mismatches = [
        (model, prompt)
        for (model, prompt), (prompt_ids, token_ids) in zip(jobs, results, strict=True)
        if _reference(references[model], prompt_ids) != token_ids
    ]
    assert all(len(token_ids) == MAX_TOKENS for _, token_ids in results)
    assert mismatches == []
    # The adapters really change the output (else the comparison above would prove little).
    assert results[0][1] != results[1][1] and results[0][1] != results[2][1]
    # Batches of both adapters, one, and none came and went; vLLM keeps one lora_requests_info series per mix, and
    # inference.node.vllm_metrics_fix keeps only the current one.
    series = [line for line in engine_http.get("/metrics").text.splitlines()
              if line.startswith("vllm:lora_requests_info{")]
    assert len(series) == 1, series


def test_add_lora_uses_the_given_id_and_serves_the_name(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    response = _add(engine_http, "acme--support", 4242, tiny_adapters["qv-r8"], pin=True)

    assert response.status_code == 200
    assert response.json() == {
        "lora_name": "acme--support",
        "lora_int_id": 4242,
        "lora_path": str(tiny_adapters["qv-r8"]),
        "pinned": True,
        "already_loaded": False,
    }
    listing = engine_http.get("/quiver/v1/loras").json()
    assert 4242 in listing["engine_lora_int_ids"]
    assert listing["loras"] == [
        {
            "lora_name": "acme--support",
            "lora_int_id": 4242,
            "lora_path": str(tiny_adapters["qv-r8"]),
            "pinned": True,
            "in_engine": True,
            "tier": "gpu",  # add_lora activates into a GPU slot
            "bytes": listing["residency"]["bytes"]["4242"],
        }
    ]
    assert listing["residency"]["bytes"]["4242"] > 0
    models = {m["id"]: m for m in engine_http.get("/v1/models").json()["data"]}
    assert models["acme--support"]["parent"] == "tiny-llama"
    completion = engine_http.post(
        "/v1/completions", json={"model": "acme--support", "prompt": "the", "max_tokens": 2}
    )
    assert completion.status_code == 200
    # Idempotent re-add.
    again = _add(engine_http, "acme--support", 4242, tiny_adapters["qv-r8"])
    assert again.status_code == 200 and again.json()["already_loaded"] is True


def test_conflicting_names_and_ids_are_refused(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    assert _add(engine_http, "acme--a", 11, tiny_adapters["qv-r8"]).status_code == 200

    other_id = _add(engine_http, "acme--a", 12, tiny_adapters["qv-r8"])
    other_name = _add(engine_http, "acme--b", 11, tiny_adapters["all-r16"])
    base_name = _add(engine_http, "tiny-llama", 13, tiny_adapters["qv-r8"])
    bad_id = _add(engine_http, "acme--c", 0, tiny_adapters["qv-r8"])
    bad_path = _add(engine_http, "acme--d", 14, tiny_adapters["qv-r8"].parent / "missing")

    assert (other_id.status_code, other_id.json()["code"]) == (409, "lora_name_conflict")
    assert (other_name.status_code, other_name.json()["code"]) == (409, "lora_int_id_conflict")
    assert (base_name.status_code, base_name.json()["code"]) == (409, "lora_name_is_base_model")
    assert (bad_id.status_code, bad_id.json()["code"]) == (400, "invalid_request")
    assert (bad_path.status_code, bad_path.json()["code"]) == (422, "engine_load_failed")
    assert [lora["lora_name"] for lora in engine_http.get("/quiver/v1/loras").json()["loras"]] == ["acme--a"]
    assert engine_http.get("/health").status_code == 200  # a failed load leaves the engine up


def test_remove_lora_frees_the_engine_slot_and_the_name(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    assert _add(engine_http, "acme--gone", 77, tiny_adapters["qv-r8"], pin=True).status_code == 200

    removed = engine_http.post("/quiver/v1/remove_lora", json={"lora_name": "acme--gone"})

    assert removed.status_code == 200 and removed.json() == {"lora_name": "acme--gone", "lora_int_id": 77}
    listing = engine_http.get("/quiver/v1/loras").json()
    assert (listing["loras"], listing["engine_lora_int_ids"]) == ([], [])
    assert (listing["residency"]["gpu"], listing["residency"]["cpu"], listing["residency"]["pinned"]) == ([], [], [])
    completion = engine_http.post(
        "/v1/completions", json={"model": "acme--gone", "prompt": "the", "max_tokens": 2}
    )
    assert completion.status_code == 404
    again = engine_http.post("/quiver/v1/remove_lora", json={"lora_name": "acme--gone"})
    assert (again.status_code, again.json()["code"]) == (404, "lora_not_found")


def test_evict_lora_frees_the_slot_and_keeps_the_name(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    """The agent's eviction: out of the CPU cache (tier disk), but a request by name reloads it instead of a 404."""
    assert _add(engine_http, "acme--ev", 78, tiny_adapters["qv-r8"], pin=True).status_code == 200

    evicted = engine_http.post("/quiver/v1/evict_lora", json={"lora_name": "acme--ev"})

    assert evicted.status_code == 200 and evicted.json() == {"lora_name": "acme--ev", "lora_int_id": 78,
                                                              "tier": "disk"}
    listing = engine_http.get("/quiver/v1/loras").json()
    assert [(x["lora_name"], x["tier"], x["pinned"]) for x in listing["loras"]] == [("acme--ev", "disk", False)]
    assert (listing["engine_lora_int_ids"], listing["residency"]["cpu"]) == ([], [])
    completion = engine_http.post("/v1/completions", json={"model": "acme--ev", "prompt": "the", "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    assert engine_http.get("/quiver/v1/loras").json()["residency"]["cpu"] == [78]  # reloaded from disk
    missing = engine_http.post("/quiver/v1/evict_lora", json={"lora_name": "acme--nope"})
    assert (missing.status_code, missing.json()["code"]) == (404, "lora_not_found")
    assert engine_http.post("/quiver/v1/remove_lora", json={"lora_name": "acme--ev"}).status_code == 200


def test_pin_lora(engine_http: httpx.Client, tiny_adapters: dict[str, Path]) -> None:
    assert _add(engine_http, "acme--pin", 88, tiny_adapters["qv-r8"]).status_code == 200

    pinned = engine_http.post("/quiver/v1/pin_lora", json={"lora_name": "acme--pin"})
    missing = engine_http.post("/quiver/v1/pin_lora", json={"lora_name": "acme--nope"})

    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert engine_http.get("/quiver/v1/loras").json()["loras"][0]["pinned"] is True
    assert (missing.status_code, missing.json()["code"]) == (404, "lora_not_found")


def test_node_key_guards_quiver_and_stock_lora_routes(clean_vllm_engine: RunningEngine) -> None:
    url = clean_vllm_engine.url
    wrong = {"Authorization": "Bearer not-the-node-key"}
    body = {"lora_name": "x", "lora_int_id": 5, "lora_path": "/tmp"}

    assert httpx.post(url + "/quiver/v1/add_lora", json=body).status_code == 401
    assert httpx.post(url + "/quiver/v1/add_lora", json=body, headers=wrong).status_code == 401
    assert httpx.get(url + "/quiver/v1/loras", headers=wrong).status_code == 401
    # The stock runtime-LoRA routes are behind vLLM's own --api-key check (VLLM_API_KEY).
    stock = httpx.post(
        url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"}, headers=wrong
    )
    assert stock.status_code == 401
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/health").status_code == 200


def test_residency_is_the_engines_own_gpu_and_cpu_lists(
    engine_http: httpx.Client, clean_vllm_engine: RunningEngine, tiny_adapters: dict[str, Path]
) -> None:
    """The reported GPU/CPU split is vLLM's LoRA manager's, and matches ``inference.policy``'s model of its LRUs."""
    model = LoRAEngineModel(clean_vllm_engine.max_loras, clean_vllm_engine.max_cpu_loras)
    ids = {f"acme--res{i}": 900 + i for i in range(3)}
    for name, lora_id in ids.items():
        assert _add(engine_http, name, lora_id, tiny_adapters["qv-r8"]).status_code == 200
        model.add_lora(lora_id)
    for name, lora_id in ids.items():  # one request each, in turn: each activates into a GPU slot
        done = engine_http.post("/v1/completions", json={"model": name, "prompt": "the", "max_tokens": 1})
        assert done.status_code == 200
        model.activate(lora_id)

    listing = engine_http.get("/quiver/v1/loras").json()
    residency = listing["residency"]
    assert residency["cpu"] == listing["engine_lora_int_ids"] == sorted(model.cpu)  # the engine's own list
    assert sorted(residency["gpu"]) == sorted(model.gpu) == [901, 902]  # the LRU one (900) lost its slot
    assert (residency["max_loras"], residency["max_cpu_loras"]) == (2, 4)
    assert residency["slot_bytes"] > 0
    tiers = {lora["lora_int_id"]: lora["tier"] for lora in listing["loras"]}
    assert tiers == {900: "cpu", 901: "gpu", 902: "gpu"}

    # The pin route re-adds the adapter (vLLM's add_lora activates it into a GPU slot), then pins its CPU copy only
    # (worker_ext): it shows in the engine's pinned set, and its GPU slot stays an LRU slot like any other.
    assert engine_http.post("/quiver/v1/pin_lora", json={"lora_name": "acme--res0"}).status_code == 200
    model.activate(900)
    model.pin_lora(900)
    after = engine_http.get("/quiver/v1/loras").json()["residency"]
    assert after["pinned"] == [900]
    assert sorted(after["gpu"]) == sorted(model.gpu)
    for name in ("acme--res1", "acme--res2"):
        done = engine_http.post("/v1/completions", json={"model": name, "prompt": "the", "max_tokens": 1})
        assert done.status_code == 200
        model.activate(ids[name])
    final = engine_http.get("/quiver/v1/loras").json()["residency"]
    assert sorted(final["gpu"]) == sorted(model.gpu) == [901, 902]  # the pinned one gave up its slot
    assert 900 in final["cpu"] and final["pinned"] == [900]  # and kept its CPU copy


def test_a_reload_in_a_request_evicts_by_the_nodes_policy(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    """An evicted adapter's next request reloads it inside the engine (no agent call): the victim that makes room is
    the policy's (LFU, the default), not vLLM's LRU-oldest (``inference.node.worker_ext._evict_by_policy``).

    Nothing timed decides it: c1 has strictly the fewest requests (a 600 s half-life cannot bring 2 below 1 within
    the test), and the reload waits until every resident is past the grace's busy second, so none counts as fresh
    (each had a request since its load: ``node_eviction.is_fresh``)."""
    assert _add(engine_http, "acme--late", 850, tiny_adapters["qv-r8"]).status_code == 200
    assert engine_http.post("/quiver/v1/evict_lora", json={"lora_name": "acme--late"}).status_code == 200
    fill = {"acme--hot": 851, "acme--c1": 852, "acme--c2": 853, "acme--c3": 854}
    for name, lora_id in fill.items():
        assert _add(engine_http, name, lora_id, tiny_adapters["qv-r8"]).status_code == 200
    for name, uses in (("acme--hot", 6), ("acme--c1", 1), ("acme--c2", 2), ("acme--c3", 2)):  # hot is LRU-oldest
        for _ in range(uses):
            done = engine_http.post("/v1/completions", json={"model": name, "prompt": "the", "max_tokens": 4})
            assert done.status_code == 200, done.text
    deadline = time.monotonic() + 30
    while min((before := engine_http.get("/quiver/v1/loras").json()["residency"])["idle_s"].values()) < GRACE_BUSY_S:
        assert time.monotonic() < deadline, before["idle_s"]
        time.sleep(0.05)
    assert before["cpu"] == [851, 852, 853, 854] and before["lru"][0] == 851
    assert before["requests"] == {"851": 6, "852": 1, "853": 2, "854": 2}

    done = engine_http.post("/v1/completions", json={"model": "acme--late", "prompt": "the", "max_tokens": 2})

    assert done.status_code == 200, done.text
    after = engine_http.get("/quiver/v1/loras").json()["residency"]
    assert after["cpu"] == [850, 851, 853, 854]  # c1 (fewest requests) left; LRU would have dropped hot (851)
    assert after["eviction"]["policy"] == "lfu"
    assert after["eviction"]["evictions"].get("lfu", 0) >= 1


def test_a_reload_in_a_request_evicts_the_over_quota_tenants_adapter_first(
    engine_http: httpx.Client, tiny_adapters: dict[str, Path]
) -> None:
    """The control plane's hint, relayed by the agent (``/quiver/v1/eviction_hints``), ranks an over-quota tenant's
    adapter first in the engine's own reloads too (``inference.policy.node_eviction``): the most used one goes."""
    assert _add(engine_http, "acme--qlate", 860, tiny_adapters["qv-r8"]).status_code == 200
    assert engine_http.post("/quiver/v1/evict_lora", json={"lora_name": "acme--qlate"}).status_code == 200
    fill = {"over--hot": 861, "acme--q1": 862, "acme--q2": 863, "acme--q3": 864}
    for name, lora_id in fill.items():
        assert _add(engine_http, name, lora_id, tiny_adapters["qv-r8"]).status_code == 200
    for name, uses in (("over--hot", 6), ("acme--q1", 1), ("acme--q2", 1), ("acme--q3", 1)):
        for _ in range(uses):
            done = engine_http.post("/v1/completions", json={"model": name, "prompt": "the", "max_tokens": 4})
            assert done.status_code == 200, done.text
    try:
        for body in ({"over_quota": "861"}, {"over_quota": [True]}, {"elsewhere": [1], "valid_s": -1}):
            assert engine_http.post("/quiver/v1/eviction_hints", json=body).status_code == 400, body
        hinted = engine_http.post("/quiver/v1/eviction_hints", json={"over_quota": [861], "valid_s": 60})
        assert hinted.status_code == 200 and hinted.json() == {"over_quota": 1, "elsewhere": 0}
        report = engine_http.get("/quiver/v1/loras").json()["residency"]
        assert report["eviction"]["hints"] == {"over_quota": [861], "elsewhere": []}
        assert report["requests"]["861"] == 6  # LFU counts requests: 6, however many steps they ran
        # Past the grace's "may still be decoding" second, so the hint alone decides (node_eviction.is_fresh).
        deadline = time.monotonic() + 30
        while engine_http.get("/quiver/v1/loras").json()["residency"]["idle_s"]["861"] < GRACE_BUSY_S:
            assert time.monotonic() < deadline
            time.sleep(0.05)

        done = engine_http.post("/v1/completions", json={"model": "acme--qlate", "prompt": "the", "max_tokens": 2})

        assert done.status_code == 200, done.text
        assert engine_http.get("/quiver/v1/loras").json()["residency"]["cpu"] == [860, 862, 863, 864]
    finally:
        assert engine_http.post("/quiver/v1/eviction_hints", json={"valid_s": 0}).status_code == 200


def test_eviction_policy_route_sets_the_workers_policy(engine_http: httpx.Client) -> None:
    try:
        set_lru = engine_http.post("/quiver/v1/eviction_policy", json={"policy": "lru"})
        assert set_lru.status_code == 200 and set_lru.json() == {"policy": "lru"}
        assert engine_http.get("/quiver/v1/loras").json()["residency"]["eviction"]["policy"] == "lru"
        for body in ({"policy": "fifo"}, {"policy": 3}, {}):
            refused = engine_http.post("/quiver/v1/eviction_policy", json=body)
            assert refused.status_code == 400, body
        assert engine_http.get("/quiver/v1/loras").json()["residency"]["eviction"]["policy"] == "lru"
    finally:
        assert engine_http.post("/quiver/v1/eviction_policy", json={"policy": "lfu"}).status_code == 200


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_abort_stops_a_named_request_and_its_stream_ends_with_the_engines_totals(
        clean_vllm_engine: RunningEngine, endpoint: str) -> None:
    """The gateway names each request (``X-Request-Id``) and, when its client leaves, aborts it by that name and reads
    the stream to its end: vLLM ends it at once with ``finish_reason`` "abort" and a final usage chunk."""
    rid = f"abort-{endpoint.replace('/', '-')}"
    N = 32  # the engine's max_num_seqs: 480 steps of a full batch take seconds, so the abort lands well before the end
    engine_id = f"chatcmpl-{rid}" if endpoint == "chat/completions" else f"cmpl-{rid}-0"
    body: dict[str, object] = {"model": "tiny-llama", "max_tokens": 480, "ignore_eos": True, "n": N, "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if endpoint == "chat/completions":
        body["messages"] = [{"role": "user", "content": "the cat"}]
    else:
        body["prompt"] = "the cat"
    events: list[dict[str, object]] = []
    seen: list[float] = []  # when the first event arrived, when the abort answered, when the stream ended
    start = time.monotonic()
    with httpx.Client(base_url=clean_vllm_engine.url, headers=clean_vllm_engine.headers, timeout=60) as client:
        with client.stream("POST", f"/v1/{endpoint}", json=body, headers={"X-Request-Id": rid}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[5:]))
                if len(events) == 1:  # the engine holds the request: abort at once
                    seen.append(time.monotonic() - start)
                    taken = client.post("/quiver/v1/abort", json={"request_ids": [engine_id, "cmpl-unknown-0"]})
                    assert taken.status_code == 200 and taken.json() == {"aborted": 2}
                    seen.append(time.monotonic() - start)
        seen.append(time.monotonic() - start)
        for refused in ({}, {"request_ids": []}, {"request_ids": [3]}, {"request_ids": ["x" * 201]},
                        {"request_ids": ["a"] * 257}):
            assert client.post("/quiver/v1/abort", json=refused).status_code == 400, refused
    final = events[-1]
    assert final["choices"] == [] and isinstance(final["usage"], dict)
    completion = final["usage"]["completion_tokens"]  # type: ignore[index]
    # Stopped, not run to max_tokens (chat: the first events carry only roles, so 0 is possible there).
    timing = "first event {:.2f} s, abort answered {:.2f} s, stream ended {:.2f} s".format(*seen)
    assert completion < N * 480, f"{completion} tokens: the abort did not stop it ({timing}, {len(events)} events)"
    reasons = {c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")}  # type: ignore[union-attr,attr-defined]
    assert reasons == {"abort"}
