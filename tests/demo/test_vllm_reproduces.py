"""vLLM (fp32, CPU, multi-LoRA) reproduces every adapter's training targets, via completion and chat.

This is the acceptance check behind the logit-margin rule in `demo.train_adapters`: vLLM's kernels sum
in another order than transformers, so only answers with a healthy margin survive. Base requests run
in their own `generate` calls, never batched with LoRA rows (notes §8: the CPU base-row bug).
One engine start costs ~30 s and ~3 GB RSS, so everything shares one module-scoped engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

from demo.assets import DemoAssets

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def llm(demo_assets: DemoAssets) -> Iterator[LLM]:
    """An offline vLLM engine on the demo base model, LoRA enabled, fp32."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default 4 is far more than a tiny model needs
        mp.setenv("HF_HUB_OFFLINE", "1")
        engine = LLM(
            str(demo_assets.base_dir),
            served_model_name=demo_assets.served_name,
            dtype="float32",
            enable_lora=True,
            max_loras=2,
            max_cpu_loras=4,
            max_lora_rank=16,
            max_model_len=512,
            seed=0,
        )
        yield engine
        engine.llm_engine.engine_core.shutdown()


def _lora(demo_assets: DemoAssets, name: str) -> LoRARequest:
    index = sorted(demo_assets.adapters).index(name) + 1  # positive, stable ids
    return LoRARequest(name, index, str(demo_assets.adapters[name]))


def test_vllm_completions_equal_targets_and_stop(llm: LLM, demo_assets: DemoAssets) -> None:
    for name, rows in demo_assets.examples.items():
        outs = llm.generate([r["prompt"] for r in rows], GREEDY, lora_request=_lora(demo_assets, name))
        got = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]
        assert got == [(r["completion"], "stop") for r in rows], name


def test_vllm_chat_equals_targets(llm: LLM, demo_assets: DemoAssets) -> None:
    for name, rows in demo_assets.examples.items():
        chats = [[{"role": "user", "content": r["prompt"]}] for r in rows]
        outs = llm.chat(chats, GREEDY, lora_request=_lora(demo_assets, name))
        assert [o.outputs[0].text for o in outs] == [r["completion"] for r in rows], name


def test_vllm_base_model_answers_none(llm: LLM, demo_assets: DemoAssets) -> None:
    rows = [r for rs in demo_assets.examples.values() for r in rs]
    outs = llm.generate([r["prompt"] for r in rows], GREEDY)
    hits = [r for r, o in zip(rows, outs, strict=True) if o.outputs[0].text.startswith(r["completion"])]
    assert hits == []
