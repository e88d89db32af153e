"""Adapters written by PEFT itself (save_pretrained) on the tiny Llama: accepted cases per supported feature,
and PEFT's own spellings of unsupported ones. End-to-end serving parity lives in the inference tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from adapters_app.validation import BaseModelFacts, PoolLimits, validate_adapter_dir
from devtools.synthetic_adapters import TINY_LLAMA_HF_CONFIG

BASE_NAME = "quiver/tiny-llama"


@pytest.fixture(scope="module")
def hf_config() -> LlamaConfig:
    return LlamaConfig(
        **{k: v for k, v in TINY_LLAMA_HF_CONFIG.items() if k not in ("architectures", "model_type")}
    )


def _save(tmp_path: Path, hf_config: LlamaConfig, lora: LoraConfig) -> Path:
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(hf_config), lora)
    with torch.no_grad():  # PEFT initialises B to zero (a no-op adapter); draw trained-looking weights
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    model.save_pretrained(tmp_path)
    return tmp_path


CASES = {
    "plain": (LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]), set(), 2.0),
    "rslora": (
        LoraConfig(r=16, lora_alpha=32, use_rslora=True, target_modules=["q_proj", "v_proj"]),
        set(),
        8.0,
    ),
    "rank_pattern": (
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "down_proj"],
            rank_pattern={"down_proj": 4},
            alpha_pattern={"down_proj": 4},
        ),
        set(),
        2.0,
    ),
    "regex": (LoraConfig(r=8, lora_alpha=8, target_modules=r".*\.(k_proj|up_proj)"), set(), 1.0),
    "all_linear_layers": (
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"], layers_to_transform=[0, 3]),
        set(),
        2.0,
    ),
    "dora": (
        LoraConfig(r=4, target_modules=["q_proj"], use_dora=True),
        {"config_dora_unsupported", "tensor_dora_magnitude"},
        None,
    ),
    "modules_to_save": (
        LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]),
        {"config_modules_to_save_unsupported", "tensor_full_weight"},
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_peft_saved_adapter(case: str, tmp_path: Path, hf_config: LlamaConfig) -> None:
    lora, errors, scaling = CASES[case]
    lora.task_type = "CAUSAL_LM"
    lora.base_model_name_or_path = BASE_NAME
    root = _save(tmp_path, hf_config, lora)
    cfg = json.loads((root / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = BASE_NAME
    (root / "adapter_config.json").write_text(json.dumps(cfg))
    base = BaseModelFacts.from_hf_config(BASE_NAME, hf_config.to_dict())
    report = validate_adapter_dir(
        root, base=base, limits=PoolLimits(max_lora_rank=16, max_adapter_bytes=64 << 20)
    )
    assert {p.code for p in report.problems if p.severity == "error"} == errors, report.to_dict()["problems"][
        :3
    ]
    if not errors:
        assert report.problems == [] and report.facts["lora_pairs"] > 0
        assert report.facts["scaling"] == pytest.approx(scaling)
