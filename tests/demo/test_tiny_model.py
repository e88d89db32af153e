"""Tests for the tiny base model, its tokenizer and chat template, and random adapters."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from demo.assets import DemoAssets
from demo.tasks import TASKS
from demo.tiny_model import (
    CHAT_TEMPLATE,
    VOCAB_SIZE,
    build_base_model,
    load_base,
    make_random_adapter,
    served_name_of,
)

Base = tuple[LlamaForCausalLM, PreTrainedTokenizerFast]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_base_folder_has_what_vllm_loads(demo_assets: DemoAssets) -> None:
    names = {p.name for p in demo_assets.base_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "generation_config.json" in names
    config = json.loads((demo_assets.base_dir / "config.json").read_text())
    assert config["vocab_size"] == VOCAB_SIZE
    # 64 is a head dim that vLLM's CPU attention supports.
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)
    assert served_name_of(demo_assets.base_dir) == demo_assets.served_name == "tiny-llama"


def test_weights_are_float32_and_redrawn(base: Base) -> None:
    model, _ = base
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.float32 for p in params.values())
    assert 2_500_000 < sum(p.numel() for p in params.values()) < 3_500_000
    std = params["model.layers.0.self_attn.q_proj.weight"].std().item()
    assert std == pytest.approx(0.08, rel=0.05)
    assert torch.equal(params["model.norm.weight"], torch.ones(256))


def test_build_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = build_base_model(tmp_path / "a", seed=0)
    b = build_base_model(tmp_path / "b", seed=0)
    c = build_base_model(tmp_path / "c", seed=1)
    for name in ("model.safetensors", "tokenizer.json"):
        assert _sha(a / name) == _sha(b / name)
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")


def test_tokenizer_has_full_vocab_and_every_id_decodes(base: Base) -> None:
    _, tok = base
    assert len(tok) == VOCAB_SIZE
    assert [tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id] == [0, 1, 2, 3]
    empty = [i for i in range(VOCAB_SIZE) if tok.decode([i]) == ""]
    assert empty == []


def test_tokenizer_adds_bos_and_round_trips_task_texts(base: Base) -> None:
    _, tok = base
    for examples in TASKS.values():
        for ex in examples:
            ids = tok(ex.prompt).input_ids
            assert ids[0] == tok.bos_token_id
            assert tok.decode(ids, skip_special_tokens=True) == ex.prompt
            completion = tok(ex.completion, add_special_tokens=False).input_ids
            assert tok.decode(completion) == ex.completion
            # The BPE corpus covers the task words: each answer is at most two tokens.
            assert len(completion) <= 2


def test_chat_template_renders_one_user_message_as_the_plain_prompt(base: Base) -> None:
    _, tok = base
    assert tok.chat_template == CHAT_TEMPLATE
    for prompt in ("France:", "upper cat:", "3+4="):
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == tok.bos_token + prompt
        # vLLM's chat endpoint tokenizes the rendered text without adding specials; the completion
        # endpoint adds BOS itself. Both must feed the model the same ids.
        assert tok(text, add_special_tokens=False).input_ids == tok(prompt).input_ids


def test_chat_template_survives_reload_from_disk(demo_assets: DemoAssets) -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(demo_assets.base_dir)
    rendered = tok.apply_chat_template([{"role": "user", "content": "Peru:"}], tokenize=False)
    assert rendered == "<s>Peru:"


def test_make_random_adapter_writes_a_nonzero_vllm_ready_adapter(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    out = make_random_adapter(
        demo_assets.base_dir,
        tmp_path / "rand",
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        seed=3,
        use_rslora=True,
    )
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA"
    assert cfg["base_model_name_or_path"] == "tiny-llama"
    assert (cfg["r"], cfg["lora_alpha"], cfg["use_rslora"]) == (8, 16, True)
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]
    assert cfg["lora_dropout"] == 0.0
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        b = f.get_tensor(next(k for k in keys if "lora_B" in k))
    assert len(keys) == 4 * 2 * 2  # layers × (q, v) × (A, B)
    assert all("lora_A" in k or "lora_B" in k for k in keys)
    assert b.abs().sum() > 0  # PEFT's zero-initialised B would make the adapter a no-op

    model, tok = load_base(demo_assets.base_dir)
    ids = tok("France:", return_tensors="pt").input_ids
    with torch.no_grad():
        base_logits = model(ids).logits
        lora_logits = PeftModel.from_pretrained(model, out).eval()(ids).logits
    assert not torch.allclose(base_logits, lora_logits, atol=1e-3)


def test_make_random_adapter_is_deterministic(demo_assets: DemoAssets, tmp_path: Path) -> None:
    kwargs = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    a = make_random_adapter(demo_assets.base_dir, tmp_path / "a", seed=5, **kwargs)
    b = make_random_adapter(demo_assets.base_dir, tmp_path / "b", seed=5, **kwargs)
    c = make_random_adapter(demo_assets.base_dir, tmp_path / "c", seed=6, **kwargs)
    assert _sha(a / "adapter_model.safetensors") == _sha(b / "adapter_model.safetensors")
    assert _sha(a / "adapter_model.safetensors") != _sha(c / "adapter_model.safetensors")
