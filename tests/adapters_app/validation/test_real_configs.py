"""The 33 real adapter_config.json files in data/lora-cases/configs (INDEX.tsv names each one's public Hugging Face
repository, path and commit), each paired with tensors generated to match it, validated against the tiny Llama
base: one verdict per file, codes spelled out.

Tensor layouts: "llama" = what PEFT writes when the config is applied to a Llama-shaped model (modules selected by
the config's own target rules, ranks from r/rank_pattern, tiny-Llama shapes); other layouts use the source
architecture's module paths (from the model's transformers/diffusers code) with foreign dimensions (64).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adapters_app.validation import BaseModelFacts, PoolLimits, validate_adapter_dir
from adapters_app.validation.config import AdapterConfig, parse_config
from devtools.synthetic_adapters import RawTensor, write_adapter

CASES = Path(__file__).parent / "data" / "lora-cases"
FOREIGN_DIM = 64

# name -> (layout, expected error codes, expected warning codes). Layout: "llama", "llama:<prefix>", or a dict of
# target name -> module path template ({i} = layer) for the source architecture; "bert-header" uses the real header.
EXPECTED: dict[str, tuple[object, set[str], set[str]]] = {
    "bert-seqcls-modules-to-save-classifier": (
        "bert-header",
        {
            "config_task_type_unsupported",
            "config_modules_to_save_unsupported",
            "target_modules_match_nothing",
            "tensor_unmapped",
            "tensor_full_weight",
            "adapter_maps_to_nothing",
        },
        {"base_model_name_mismatch"},
    ),
    "clip-feature-extraction-null-base": (
        {
            "q_proj": "vision_model.encoder.layers.{i}.self_attn.q_proj",
            "k_proj": "vision_model.encoder.layers.{i}.self_attn.k_proj",
            "v_proj": "vision_model.encoder.layers.{i}.self_attn.v_proj",
            "out_proj": "vision_model.encoder.layers.{i}.self_attn.out_proj",
            "fc1": "vision_model.encoder.layers.{i}.mlp.fc1",
            "fc2": "vision_model.encoder.layers.{i}.mlp.fc2",
        },
        {"config_task_type_unsupported", "tensor_unmapped", "tensor_shape_mismatch"},
        {"base_model_name_missing", "target_module_not_in_base"},
    ),
    "codonbert-rslora-tokencls": (
        {
            "query": "bert.encoder.layer.{i}.attention.self.query",
            "value": "bert.encoder.layer.{i}.attention.self.value",
        },
        {
            "config_task_type_unsupported",
            "target_modules_match_nothing",
            "tensor_unmapped",
            "adapter_maps_to_nothing",
        },
        {"base_model_name_mismatch"},
    ),
    "cosmos-modules-to-save-embed-tokens": (
        "llama+embed-copy",
        {"config_modules_to_save_unsupported", "adapter_rank_too_high", "tensor_full_weight"},
        {"base_model_name_local_path"},
    ),
    "diffusers-unet-to-q-to-v": (
        {
            "to_q": "down_blocks.0.attentions.{i}.transformer_blocks.0.attn1.to_q",
            "to_v": "down_blocks.0.attentions.{i}.transformer_blocks.0.attn1.to_v",
        },
        {"target_modules_match_nothing", "tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_missing"},
    ),
    "flan-t5-seq2seq": (
        {t: "encoder.block.{i}.layer.0.SelfAttention." + t for t in ("q", "k", "v", "o")},
        {
            "config_task_type_unsupported",
            "target_modules_match_nothing",
            "tensor_unmapped",
            "adapter_maps_to_nothing",
        },
        {"base_model_name_mismatch"},
    ),
    "gemma-wrong-key-alpha": ("llama", {"config_missing_field"}, {"base_model_name_mismatch"}),
    "gemma2-r64-alpha8-bnb4-base": ("llama", {"adapter_rank_too_high"}, {"base_model_name_mismatch"}),
    "gemma3-unsloth-regex-target-string": ("llama", set(), {"base_model_name_mismatch"}),
    "gemma4-exclude-modules-regex": ("llama", set(), {"base_model_name_mismatch"}),
    "glm4-fused-query-key-value": (
        {
            "query_key_value": "transformer.encoder.layers.{i}.self_attention.query_key_value",
            "dense": "transformer.encoder.layers.{i}.self_attention.dense",
            "dense_h_to_4h": "transformer.encoder.layers.{i}.mlp.dense_h_to_4h",
            "dense_4h_to_h": "transformer.encoder.layers.{i}.mlp.dense_4h_to_h",
        },
        {"target_modules_match_nothing", "tensor_fused_module", "tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_local_path"},
    ),
    "gpt2-fan-in-fan-out": (
        {"c_attn": "transformer.h.{i}.attn.c_attn", "c_proj": "transformer.h.{i}.attn.c_proj"},
        {"target_modules_match_nothing", "tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_mismatch", "config_fan_in_fan_out_ignored"},
    ),
    "internlm-r64-alpha16-local-base": ("llama", {"adapter_rank_too_high"}, {"base_model_name_local_path"}),
    "jax-tunix-not-peft": (
        {"q_einsum": "layers.{i}.attn.q_einsum"},
        {"config_not_peft", "tensor_unmapped", "adapter_maps_to_nothing"},
        set(),
    ),
    "lerobot-not-a-peft-config": (
        {"action_out_proj": "model.action_out_proj"},
        {"config_not_peft", "tensor_unmapped", "adapter_maps_to_nothing"},
        set(),
    ),
    "llama2-legacy-enable-lora-merge-weights": ("llama", set(), {"base_model_name_mismatch"}),
    "llama2-lora-on-embed-and-lmhead": ("llama", {"engine_module_unsupported"}, {"base_model_name_mismatch"}),
    "llama31-duplicate-target-modules": ("llama", set(), {"base_model_name_mismatch"}),
    "llava-null-base": ("llama:language_model.", {"tensor_name_variant"}, {"base_model_name_missing"}),
    "mistral-rank1-alpha1": ("llama", set(), {"base_model_name_mismatch"}),
    "mlx-lora-parameters-keys": (
        "mlx",
        {"config_not_peft", "tensor_unmapped", "adapter_maps_to_nothing"},
        set(),
    ),
    "mlx-training-args-not-peft": (
        "mlx",
        {"config_not_peft", "tensor_unmapped", "adapter_maps_to_nothing"},
        set(),
    ),
    "nemotron-hybrid-mamba-in-proj": (
        {
            t: "backbone.layers.{i}.mixer." + t
            for t in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "up_proj", "down_proj")
        },
        {"tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_local_path", "target_module_not_in_base"},
    ),
    "nemotron-minimal-handwritten": ("llama", set(), {"base_model_name_mismatch"}),
    "phi15-fused-Wqkv-old-schema": (
        {
            "Wqkv": "transformer.h.{i}.mixer.Wqkv",
            "out_proj": "transformer.h.{i}.mixer.out_proj",
            "fc1": "transformer.h.{i}.mlp.fc1",
            "fc2": "transformer.h.{i}.mlp.fc2",
        },
        {"target_modules_match_nothing", "tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_mismatch"},
    ),
    "phi2-neox-style-names": (
        {
            "query_key_value": "model.layers.{i}.self_attn.query_key_value",
            "dense": "model.layers.{i}.self_attn.dense",
            "dense_h_to_4h": "model.layers.{i}.mlp.dense_h_to_4h",
            "dense_4h_to_h": "model.layers.{i}.mlp.dense_4h_to_h",
        },
        {
            "adapter_rank_too_high",
            "target_modules_match_nothing",
            "tensor_fused_module",
            "tensor_unmapped",
            "adapter_maps_to_nothing",
        },
        {"base_model_name_mismatch"},
    ),
    "phi3-unsloth-unfused-names": ("llama", set(), {"base_model_name_mismatch"}),
    "privacy-filter-tokencls-modules-to-save": (
        "llama+score",
        {"config_task_type_unsupported", "config_modules_to_save_unsupported", "tensor_full_weight"},
        {"base_model_name_mismatch"},
    ),
    # Explicit paths name layers 0-27; the tiny base has 4 layers, so the rest are named as absent.
    "qwen25vl-196-explicit-module-paths": (
        "llama",
        {"adapter_rank_too_high"},
        {"base_model_name_local_path", "target_module_not_in_base"},
    ),
    "qwythos-seq2seq-tasktype-16-targets": (
        {
            "q_proj": "model.language_model.layers.{i}.self_attn.q_proj",
            "in_proj_qkv": "model.language_model.layers.{i}.linear_attn.in_proj_qkv",
            "qkv": "model.visual.blocks.{i}.attn.qkv",
            "linear_fc1": "model.visual.blocks.{i}.mlp.linear_fc1",
        },
        {"config_task_type_unsupported", "tensor_unmapped", "tensor_shape_mismatch"},
        {"base_model_name_local_path", "target_module_not_in_base"},
    ),
    "rwkv-legacy-schema": (
        {t: "rwkv.blocks.{i}.attention." + t for t in ("key", "value", "receptance", "output")},
        {"target_modules_match_nothing", "tensor_unmapped", "adapter_maps_to_nothing"},
        {"base_model_name_mismatch"},
    ),
    "smolvlm-vision-and-text-targets": (
        {
            "q_proj": "model.text_model.layers.{i}.self_attn.q_proj",
            "fc1": "model.vision_model.encoder.layers.{i}.mlp.fc1",
            "proj": "model.connector.modality_projection.proj",
        },
        {"tensor_unmapped", "tensor_shape_mismatch"},
        {"base_model_name_mismatch", "target_module_not_in_base"},
    ),
    "whisper-tasktype-null": (
        {
            "q_proj": "model.encoder.layers.{i}.self_attn.q_proj",
            "v_proj": "model.decoder.layers.{i}.self_attn.v_proj",
        },
        {"tensor_shape_mismatch"},
        {"base_model_name_mismatch"},
    ),
}


def _pair(rng: np.random.Generator, path: str, r: int, d_in: int, d_out: int) -> dict[str, np.ndarray]:
    return {
        f"base_model.model.{path}.lora_A.weight": rng.standard_normal((r, d_in), dtype=np.float32),
        f"base_model.model.{path}.lora_B.weight": rng.standard_normal((d_out, r), dtype=np.float32),
    }


def _llama_tensors(
    cfg: AdapterConfig, base: BaseModelFacts, wrap: str = ""
) -> dict[str, np.ndarray | RawTensor]:
    """What PEFT writes when this config is applied to the tiny Llama (its own targeting rules)."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray | RawTensor] = {}
    for path in base.module_paths():
        layer = int(path.split(".")[2]) if path.startswith("model.layers.") else None
        if not cfg.targets(path, layer):
            continue
        rank, _ = cfg.rank_and_alpha(path)
        leaf = path.rsplit(".", 1)[-1]
        if leaf == "embed_tokens":
            out[f"base_model.model.{path}.lora_embedding_A"] = rng.standard_normal(
                (rank, base.vocab_size), dtype=np.float32
            )
            out[f"base_model.model.{path}.lora_embedding_B"] = rng.standard_normal(
                (base.hidden_size, rank), dtype=np.float32
            )
        elif leaf == "lm_head":
            out.update(_pair(rng, path, rank, base.hidden_size, base.vocab_size))
        else:
            shape = base.modules[leaf]
            out.update(_pair(rng, wrap + path, rank, shape.in_features, shape.out_features))
    return out


def _tensors(
    layout: object, raw_cfg: dict, cfg: AdapterConfig | None, base: BaseModelFacts
) -> dict[str, np.ndarray | RawTensor]:
    rng = np.random.default_rng(1)
    r = raw_cfg.get("r") or 8
    if isinstance(layout, dict):
        out: dict[str, np.ndarray | RawTensor] = {}
        for template in layout.values():
            for i in range(2):
                out.update(_pair(rng, template.format(i=i), r, FOREIGN_DIM, FOREIGN_DIM))
        return out
    if layout == "bert-header":
        header = json.loads((CASES / "safetensors/bert-seqcls-adapter-header.json").read_text())
        header.pop("__metadata__", None)
        return {k: RawTensor(v["dtype"], tuple(v["shape"])) for k, v in header.items()}
    if layout == "mlx":  # MLX-LM adapters.safetensors names: lora_a [in, r], lora_b [r, out]
        return {
            "model.layers.0.self_attn.q_proj.lora_a": rng.standard_normal((256, 16), dtype=np.float32),
            "model.layers.0.self_attn.q_proj.lora_b": rng.standard_normal((16, 256), dtype=np.float32),
        }
    assert cfg is not None, "llama layouts need a parseable config"
    assert isinstance(layout, str)
    if layout.startswith("llama:"):
        return _llama_tensors(cfg, base, wrap=layout.split(":", 1)[1])
    out = _llama_tensors(cfg, base)
    if layout == "llama+embed-copy":  # modules_to_save copy of a resized embedding (tokens added)
        out["base_model.model.model.embed_tokens.weight"] = RawTensor(
            "F32", (base.vocab_size + 6, base.hidden_size)
        )
    elif layout == "llama+score":
        out["base_model.model.score.weight"] = RawTensor("F32", (5, base.hidden_size))
    return out


def test_every_real_config_has_a_case() -> None:
    names = {p.stem for p in (CASES / "configs").glob("*.json")}
    assert names == set(EXPECTED) and len(names) == 33


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_config_verdict(name: str, tmp_path: Path, base: BaseModelFacts) -> None:
    layout, errors, warnings = EXPECTED[name]
    raw = (CASES / "configs" / f"{name}.json").read_bytes()
    raw_cfg = json.loads(raw)
    # A config the validator refuses (e.g. no lora_alpha) still tells the generator which modules it targets.
    cfg, _, _ = parse_config(json.dumps({"lora_alpha": 8, **raw_cfg}).encode())
    root = write_adapter(tmp_path / name, raw, _tensors(layout, raw_cfg, cfg, base))
    report = validate_adapter_dir(
        root, base=base, limits=PoolLimits(max_lora_rank=32, max_adapter_bytes=64 << 20)
    )
    got_errors = {p.code for p in report.problems if p.severity == "error"}
    got_warnings = {p.code for p in report.problems if p.severity == "warning"}
    assert (got_errors, got_warnings) == (errors, warnings), json.dumps(
        report.to_dict()["problems"], indent=1
    )[:3000]
    assert report.ok is (not errors)
    assert all(p.message and p.hint for p in report.problems)


@pytest.mark.parametrize(("name", "says"), [
    ("lerobot-not-a-peft-config", "adapter_config.json has no peft_type: it is not a PEFT adapter config."),
    ("mlx-training-args-not-peft", "adapter_config.json has no peft_type: it looks like an MLX-LM LoRA config"),
])
def test_not_peft_message_reads_as_a_sentence(name: str, says: str) -> None:
    # A fresh user read "it looks like not a PEFT adapter config" for a config of no known format.
    _, problems, _ = parse_config((CASES / "configs" / f"{name}.json").read_bytes())
    assert [p.message for p in problems if p.code == "config_not_peft"][0].startswith(says)
