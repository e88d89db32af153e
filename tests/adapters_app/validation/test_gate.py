"""validate_adapter_dir: the basic gate of issue 2, on synthetic adapters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adapters_app.validation import BaseModelFacts, PoolLimits, ValidationReport, validate_adapter_dir
from devtools.synthetic_adapters import lora_tensors, peft_config, validate_synthetic, write_adapter

BASE_NAME = "quiver/tiny-llama"


def _validate(
    tmp_path: Path, base: BaseModelFacts, limits: PoolLimits, cfg=None, tensors=None
) -> ValidationReport:
    return validate_synthetic(tmp_path, base, limits, cfg, tensors, base_model_name=BASE_NAME)


def test_good_adapter_accepted_with_facts(tmp_path: Path, base: BaseModelFacts, limits: PoolLimits) -> None:
    report = _validate(tmp_path, base, limits)
    assert report.ok and report.problems == []
    f = report.facts
    assert (f["r"], f["lora_alpha"], f["scaling"], f["use_rslora"]) == (8, 16.0, 2.0, False)
    assert f["target_modules"] == ["q_proj", "v_proj"] and f["targeted_module_count"] == 8
    assert f["tensor_count"] == 16 and f["lora_pairs"] == 8
    assert f["base_model_decision"] == f"tensor shapes match {BASE_NAME}"
    d = report.to_dict()
    assert d["schema"] == 1 and d["ok"] is True
    assert ValidationReport.from_dict(json.loads(json.dumps(d))).to_dict() == d


def test_peft_type_must_be_lora(tmp_path: Path, base: BaseModelFacts, limits: PoolLimits) -> None:
    report = _validate(tmp_path, base, limits, cfg=peft_config(BASE_NAME, peft_type="IA3"))
    assert not report.ok and "config_peft_type_unsupported" in report.codes


def test_rank_above_pool_limit_names_the_setting(tmp_path: Path, base: BaseModelFacts) -> None:
    limits = PoolLimits(max_lora_rank=4, max_adapter_bytes=1 << 30)
    report = _validate(tmp_path, base, limits)
    (p,) = [p for p in report.problems if p.code == "adapter_rank_too_high"]
    assert p.severity == "error" and p.field == "r"
    assert "max_lora_rank" in p.hint and "8" in p.message and "4" in p.message


def test_rank_pattern_counts_for_the_limit(tmp_path: Path, base: BaseModelFacts) -> None:
    limits = PoolLimits(max_lora_rank=8, max_adapter_bytes=1 << 30)
    cfg = peft_config(BASE_NAME, rank_pattern={"v_proj": 12})
    report = _validate(tmp_path, base, limits, cfg=cfg, tensors=lora_tensors(base, rank_for={"v_proj": 12}))
    (p,) = [p for p in report.problems if p.code == "adapter_rank_too_high"]
    assert p.field == "rank_pattern"


def test_shapes_from_other_model_rejected_and_name_mismatch_warned(
    tmp_path: Path, limits: PoolLimits, base
) -> None:
    other = BaseModelFacts.from_hf_config(
        "other",
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 1024,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
        },
    )
    report = _validate(
        tmp_path, base, limits, cfg=peft_config("meta-llama/Llama-3.1-8B"), tensors=lora_tensors(other)
    )
    assert not report.ok
    assert report.codes.count("tensor_shape_mismatch") == 8
    (w,) = [p for p in report.problems if p.code == "base_model_name_mismatch"]
    assert w.severity == "warning" and "do not match" in w.message


def test_name_mismatch_with_matching_shapes_is_only_a_warning(tmp_path: Path, base, limits) -> None:
    report = _validate(tmp_path, base, limits, cfg=peft_config("unsloth/tiny-llama-bnb-4bit"))
    assert report.ok and report.codes == ["base_model_name_mismatch"]
    assert (
        "decided by the tensor shapes" in report.problems[0].message and "match" in report.problems[0].message
    )


@pytest.mark.parametrize(
    ("named", "code"),
    [(None, "base_model_name_missing"), ("/root/models/llama", "base_model_name_local_path")],
)
def test_null_or_local_base_name(tmp_path: Path, base, limits, named, code) -> None:
    report = _validate(tmp_path, base, limits, cfg=peft_config(named))
    assert report.ok and report.codes == [code]


def test_wrong_tensor_shape_named(tmp_path: Path, base, limits) -> None:
    tensors = lora_tensors(base)
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[name] = np.zeros((8, 100), dtype=np.float32)
    report = _validate(tmp_path, base, limits, tensors=tensors)
    (p,) = [p for p in report.problems if p.code == "tensor_shape_mismatch"]
    assert p.field == name and "[8, 256]" in p.message


def test_truncated_safetensors_readable_reason(tmp_path: Path, base, limits) -> None:
    root = write_adapter(tmp_path / "a", peft_config(BASE_NAME), lora_tensors(base))
    w = root / "adapter_model.safetensors"
    w.write_bytes(w.read_bytes()[:-1000])
    report = validate_adapter_dir(root, base=base, limits=limits)
    (p,) = report.problems
    assert p.code == "safetensors_truncated" and "truncated" in p.message


def test_pickle_in_folder_never_loaded(tmp_path: Path, base, limits) -> None:
    root = write_adapter(tmp_path / "a", peft_config(BASE_NAME), lora_tensors(base))
    (root / "adapter_model.bin").write_bytes(b"\x80\x04\x95 not to be unpickled")
    assert "pickle_weights" in validate_adapter_dir(root, base=base, limits=limits).codes


def test_pickle_renamed_as_safetensors(tmp_path: Path, base, limits) -> None:
    root = write_adapter(tmp_path / "a", peft_config(BASE_NAME), {})
    (root / "adapter_model.safetensors").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    assert validate_adapter_dir(root, base=base, limits=limits).codes == ["pickle_weights"]


def test_missing_weights_and_config(tmp_path: Path, base, limits) -> None:
    (tmp_path / "a").mkdir()
    report = validate_adapter_dir(tmp_path / "a", base=base, limits=limits)
    assert report.codes == ["missing_adapter_config", "missing_adapter_weights"]


def test_never_raises_on_garbage(tmp_path: Path, base, limits) -> None:
    root = tmp_path / "a"
    root.mkdir()
    (root / "adapter_config.json").write_bytes(b"\xff\xfe{")
    (root / "adapter_model.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"[1,2]" + b" " * 11)
    report = validate_adapter_dir(root, base=base, limits=limits)
    assert report.codes == ["config_invalid_json", "safetensors_header_not_json"]


def test_from_hf_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="architectures"):
        BaseModelFacts.from_hf_config("x", {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="intermediate_size"):
        BaseModelFacts.from_hf_config(
            "x", {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2}
        )


def test_base_facts_round_trip(base: BaseModelFacts) -> None:
    d = json.loads(json.dumps(base.to_dict()))
    assert BaseModelFacts.from_dict(d) == base
    assert base.modules["k_proj"].out_features == 128 and base.modules["down_proj"].in_features == 512
    with pytest.raises(ValueError, match="vocab_size"):
        BaseModelFacts.from_dict({k: v for k, v in d.items() if k != "vocab_size"})


@pytest.mark.parametrize(("config_r", "tensor_r"), [(4, 8), (16, 8)])
def test_rank_disagreeing_with_tensors_is_not_called_a_base_model_mismatch(
    tmp_path: Path, base, limits, config_r: int, tensor_r: int  # type: ignore[no-untyped-def]
) -> None:
    config = peft_config("meta-llama/some-other-name", r=config_r)
    root = write_adapter(tmp_path / "a", config, lora_tensors(base, r=tensor_r))
    report = validate_adapter_dir(root, base=base, limits=limits)
    assert "tensor_rank_mismatch" in report.codes
    assert "tensor_shape_mismatch" not in report.codes and "adapter_maps_to_nothing" not in report.codes
    assert "do not match" not in report.facts["base_model_decision"]
    assert all("do not match" not in p.message for p in report.problems)
    assert "ranks disagree with adapter_config.json" in report.facts["base_model_decision"]


@pytest.mark.parametrize(("field", "value"), [
    ("target_modules", "(a+)+$"), ("target_modules", "(\\w)\\1"), ("exclude_modules", "(q|qq)*_proj"),
    ("target_modules", ".*a" * 5 + "q_proj"), ("target_modules", "x" * 1100),
    ("rank_pattern", {"(.*)+q_proj": 4}),
    # Bounded repeats in a row: no nesting and no unbounded repeat, yet 0.36 s per module path at eight.
    ("rank_pattern", {".{0,16}" * 8 + "X": 8}), ("target_modules", ".{0,16}" * 6 + "X"),
])
def test_explosive_regexes_are_refused(tmp_path: Path, base, limits, field: str, value: object) -> None:  # type: ignore[no-untyped-def]
    config = peft_config(BASE_NAME)
    config[field] = value
    root = write_adapter(tmp_path / "a", config, lora_tensors(base))
    report = validate_adapter_dir(root, base=base, limits=limits)  # refused before any pattern is matched
    problems = [p for p in report.problems if p.code == "config_invalid_field" and p.field == field]
    assert problems, report.codes


def test_ordinary_peft_regexes_pass(tmp_path: Path, base, limits) -> None:  # type: ignore[no-untyped-def]
    config = peft_config(BASE_NAME, target_modules=r".*\.(q_proj|v_proj)")
    root = write_adapter(tmp_path / "a", config, lora_tensors(base))
    assert validate_adapter_dir(root, base=base, limits=limits).ok


@pytest.mark.parametrize("field", ["base_model_name_or_path", "target_modules", "peft_type"])
def test_a_config_string_with_an_unpaired_surrogate_is_refused(field: str) -> None:
    # It decoded to a str nothing can store or show: the version went ready and its pages answered 500.
    from adapters_app.validation.config import parse_config
    doc = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
           "base_model_name_or_path": "tiny"}
    raw = json.dumps(doc).replace(json.dumps(doc[field])[1:-1] if field != "target_modules" else "q_proj",
                                  "\\ud800", 1).encode()
    config, problems, _ = parse_config(raw)
    assert config is None and [p.code for p in problems] == ["config_invalid_json"]
    assert "surrogate" in problems[0].message
