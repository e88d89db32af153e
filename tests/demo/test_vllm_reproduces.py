"""vLLM (fp32, CPU, multi-LoRA, the session's OpenAI server) reproduces every adapter's training targets.

This is the acceptance check behind the logit-margin rule in `demo.train_adapters`: vLLM's kernels sum in another
order than transformers, so only answers with a healthy margin survive. It reuses the session engine (one start per
test session) and loads the demo adapters through the node's `/quiver/v1/add_lora` route.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from demo.assets import DemoAssets
from tests.fixtures.vllm import RunningEngine

MAX_TOKENS = 8


@pytest.fixture
def engine(clean_vllm_engine: RunningEngine, demo_assets: DemoAssets) -> Iterator[httpx.Client]:
    """An HTTP client on the engine with the three demo adapters loaded under ids 1..3."""
    with httpx.Client(base_url=clean_vllm_engine.url, headers=clean_vllm_engine.headers, timeout=120) as client:
        for lora_int_id, name in enumerate(sorted(demo_assets.adapters), start=1):
            client.post("/quiver/v1/add_lora", json={
                "lora_name": name, "lora_int_id": lora_int_id, "lora_path": str(demo_assets.adapters[name]),
            }).raise_for_status()
        yield client


def test_completions_and_chat_equal_targets_and_stop(engine: httpx.Client, demo_assets: DemoAssets) -> None:
    for name, rows in demo_assets.examples.items():
        for row in rows:
            out = engine.post("/v1/completions", json={"model": name, "prompt": row["prompt"],
                                                       "max_tokens": MAX_TOKENS, "temperature": 0}).json()
            assert (out["choices"][0]["text"], out["choices"][0]["finish_reason"]) == (row["completion"], "stop")
        # Chat once per adapter: the template renders one user message to exactly the completion prompt.
        chat = engine.post("/v1/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": rows[0]["prompt"]}],
            "max_tokens": MAX_TOKENS, "temperature": 0,
        }).json()
        assert chat["choices"][0]["message"]["content"] == rows[0]["completion"], name


def test_base_model_answers_none(engine: httpx.Client, demo_assets: DemoAssets) -> None:
    rows = [r for rs in demo_assets.examples.values() for r in rs]
    out = engine.post("/v1/completions", json={"model": demo_assets.served_name, "prompt": [r["prompt"] for r in rows],
                                               "max_tokens": MAX_TOKENS, "temperature": 0}).json()
    texts = {c["index"]: c["text"] for c in out["choices"]}
    hits = [r["prompt"] for i, r in enumerate(rows) if texts[i].startswith(r["completion"])]
    assert hits == []
