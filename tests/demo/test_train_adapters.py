"""The trained adapters answer their own prompts exactly (greedy, transformers+PEFT); the base does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from demo.assets import DemoAssets
from demo.tasks import TASKS, Example
from demo.train_adapters import TrainConfig, encode, greedy_completion, train_adapter

Base = tuple[LlamaForCausalLM, PreTrainedTokenizerFast]


def test_at_least_three_adapters_with_their_examples(demo_assets: DemoAssets) -> None:
    assert set(demo_assets.adapters) == {"capitals", "upper", "sums"}
    for name, examples in TASKS.items():
        assert 8 <= len(examples) <= 12
        assert demo_assets.examples[name] == [ex.as_dict() for ex in examples]
        on_disk = json.loads((demo_assets.adapters[name] / "examples.json").read_text())
        assert on_disk == demo_assets.examples[name]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_adapter_greedy_output_equals_every_target(
    name: str, demo_assets: DemoAssets, adapted: dict[str, PeftModel], base: Base
) -> None:
    _, tok = base
    for row in demo_assets.examples[name]:
        text, ids = greedy_completion(adapted[name], tok, row["prompt"], max_new_tokens=6)
        assert text == row["completion"], row
        assert ids[-1] == tok.eos_token_id  # stops right after the answer


@pytest.mark.parametrize("name", sorted(TASKS))
def test_adapter_logit_margin_is_healthy_at_every_step(
    name: str, demo_assets: DemoAssets, adapted: dict[str, PeftModel], base: Base
) -> None:
    # vLLM's fp32 kernels sum in another order; a ≥1.0 top-1/top-2 gap keeps its argmax the same.
    _, tok = base
    examples = [Example(**row) for row in demo_assets.examples[name]]
    for enc in encode(tok, examples):
        ids = torch.tensor([enc.prompt_ids + enc.target_ids])
        with torch.no_grad():
            logits = adapted[name](input_ids=ids).logits[0]
        for step, target in enumerate(enc.target_ids):
            row = logits[len(enc.prompt_ids) - 1 + step]
            top2 = row.topk(2)
            assert top2.indices[0].item() == target
            assert (top2.values[0] - top2.values[1]).item() >= 1.0


def test_base_model_answers_none_of_the_prompts(demo_assets: DemoAssets, base: Base) -> None:
    model, tok = base
    for rows in demo_assets.examples.values():
        for row in rows:
            text, _ = greedy_completion(model, tok, row["prompt"], max_new_tokens=6)
            assert not text.startswith(row["completion"]), row


def test_adapters_are_valid_for_vllm(demo_assets: DemoAssets) -> None:
    # Mirrors vllm/lora/peft_helper.py validate_legal and Quiver's convention 12.
    for path in demo_assets.adapters.values():
        cfg = json.loads((path / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA"
        assert cfg["base_model_name_or_path"] == demo_assets.served_name
        assert cfg["r"] <= 16
        assert not cfg["modules_to_save"]
        assert cfg["use_dora"] is False
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
            keys = list(f.keys())
            dtypes = {f.get_tensor(k).dtype for k in keys}
        assert len(keys) == 4 * 7 * 2  # layers × projections × (A, B)
        assert dtypes == {torch.float32}
        assert not any("embed" in k or "lm_head" in k for k in keys)


def test_training_is_fast_and_recorded(demo_assets: DemoAssets) -> None:
    manifest = json.loads((demo_assets.root / "manifest.json").read_text())
    assert manifest["total_build_seconds"] < 120  # issue 2: well under 2 minutes on 2 cores
    for name in TASKS:
        stats = json.loads((demo_assets.adapters[name] / "training.json").read_text())
        assert stats["min_margin"] >= 1.0
        assert 0 < stats["steps"] <= TrainConfig().max_steps


def test_training_refuses_a_task_the_base_already_answers(
    demo_assets: DemoAssets, base: Base, tmp_path: Path
) -> None:
    model, tok = base
    text, _ = greedy_completion(model, tok, "France:", max_new_tokens=1)
    already = Example("France:", text)  # the base's own greedy continuation
    with pytest.raises(RuntimeError, match="base model already answers"):
        train_adapter(
            demo_assets.base_dir, "dup", [already], tmp_path / "dup", config=TrainConfig(max_steps=1)
        )
    assert not (tmp_path / "dup").exists()
