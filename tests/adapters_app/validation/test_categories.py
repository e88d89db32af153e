"""One test per category of issue 3 (files, config, tensors, engine limits), asserting codes on synthetic adapters."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from adapters_app.validation import (
    BaseModelFacts,
    PoolLimits,
    ValidationReport,
    parse_header,
    validate_adapter_dir,
)
from devtools.synthetic_adapters import (
    RawTensor,
    lora_tensors,
    peft_config,
    to_bf16,
    validate_synthetic,
    write_adapter,
    write_safetensors,
)

BASE_NAME = "quiver/tiny-llama"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def _run(
    tmp_path: Path, base: BaseModelFacts, limits: PoolLimits, cfg=None, tensors=None
) -> ValidationReport:
    return validate_synthetic(tmp_path, base, limits, cfg, tensors, base_model_name=BASE_NAME)


def _errors(report: ValidationReport) -> set[str]:
    return {p.code for p in report.problems if p.severity == "error"}


# --- 1. untrusted files -------------------------------------------------------------------------------------------


def _header(doc: object, data: bytes = b"", *, raw: bytes | None = None, n: int | None = None) -> bytes:
    body = raw if raw is not None else json.dumps(doc).encode()
    return (len(body) if n is None else n).to_bytes(8, "little") + body + data


@pytest.mark.parametrize(
    ("blob", "code"),
    [
        (b"\x01\x00", "safetensors_truncated"),
        (_header({}, n=10**9), "safetensors_header_too_large"),
        (_header({}, n=50), "safetensors_truncated"),
        (_header(None, raw=b"{\xff}"), "safetensors_header_not_utf8"),
        (_header(None, raw=b"[]"), "safetensors_header_not_json"),
        (_header(None, raw=b'{"a": NaN}'), "safetensors_header_not_json"),
        (_header(None, raw=b"\n{}"), "safetensors_header_whitespace"),
        (_header(None, raw=b"{}\t"), "safetensors_header_whitespace"),
        (_header({"__metadata__": {"a": 1}}), "safetensors_bad_metadata"),
        (_header({"t": {"dtype": "F32", "shape": [1]}}), "safetensors_bad_entry"),
        (
            _header(
                None,
                raw=b'{"t": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, "t": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}',
            ),
            "safetensors_bad_entry",
        ),
        (
            _header({"t": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "safetensors_unknown_dtype",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "safetensors_bad_shape",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4),
            "safetensors_bad_shape",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
            "safetensors_bad_offsets",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
            "safetensors_size_mismatch",
        ),
        (
            _header(
                {
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
                },
                b"\0" * 6,
            ),
            "safetensors_overlap",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
            "safetensors_gap",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9),
            "safetensors_trailing_bytes",
        ),
        (
            _header({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 9),
            "safetensors_truncated",
        ),
    ],
)
def test_header_rules(blob: bytes, code: str) -> None:
    header, problems = parse_header(io.BytesIO(blob), len(blob))
    assert header is None and [p.code for p in problems] == [code]


def test_header_accepts_reference_writer_output(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(
        {"a": np.ones((3, 5), np.float16), "b": np.zeros((0,), np.float32)},
        str(tmp_path / "x.safetensors"),
        metadata={"format": "pt"},
    )
    data = (tmp_path / "x.safetensors").read_bytes()
    header, problems = parse_header(io.BytesIO(data), len(data))
    assert problems == [] and header is not None
    assert {t.name: t.shape for t in header.tensors} == {"a": (3, 5), "b": (0,)} and header.metadata == {
        "format": "pt"
    }


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"", "weights_empty_file"),
        (
            b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 1234\n",
            "weights_git_lfs_pointer",
        ),
        (b"\n<!DOCTYPE html><html><body>Sign in</body></html>", "weights_html_page"),
        (b"\x80\x02}q\x00.", "pickle_weights"),
        (b"PK\x03\x04archive/data.pkl", "pickle_weights"),
    ],
)
def test_not_weights_files_named(tmp_path: Path, base, limits, content: bytes, code: str) -> None:
    root = write_adapter(tmp_path / "a", peft_config(BASE_NAME), {})
    (root / "adapter_model.safetensors").write_bytes(content)
    report = validate_adapter_dir(root, base=base, limits=limits)
    assert report.codes == [code]


def test_safetensors_whose_length_looks_like_pickle_is_not_misnamed(tmp_path: Path) -> None:
    """A header length of 640 starts the file with 0x80 0x02, a pickle protocol-2 prefix; the '{' at byte 8 wins."""
    from adapters_app.validation.sniff import sniff_weights

    body = b"{}" + b" " * 638
    data = len(body).to_bytes(8, "little") + body
    assert data[:2] == b"\x80\x02" and sniff_weights(data[:512], len(data), "w") is None


# --- 2. the config -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"use_dora": True}, "config_dora_unsupported"),
        ({"bias": "all"}, "config_bias_unsupported"),
        ({"lora_bias": True}, "config_bias_unsupported"),
        ({"modules_to_save": ["lm_head"]}, "config_modules_to_save_unsupported"),
        ({"trainable_token_indices": [5, 6]}, "config_trainable_tokens_unsupported"),
        ({"init_lora_weights": "pissa"}, "config_init_unsupported"),
        ({"layer_replication": [[0, 2]]}, "config_feature_unsupported"),
        ({"task_type": "SEQ_CLS"}, "config_task_type_unsupported"),
        ({"task_type": "CHAT"}, "config_task_type_unknown"),
        ({"r": 0}, "config_invalid_field"),
        ({"lora_alpha": "16"}, "config_invalid_field"),
        ({"target_modules": "(unclosed"}, "config_invalid_field"),
        ({"target_modules": ".*q_proj", "layers_to_transform": [0]}, "config_invalid_field"),
        ({"rank_pattern": {"q_proj": 2.5}}, "config_invalid_field"),
        ({"target_modules": None}, "config_missing_field"),
    ],
)
def test_config_feature_rejections(tmp_path: Path, base, limits, overrides: dict, code: str) -> None:
    report = _run(tmp_path, base, limits, cfg=peft_config(BASE_NAME, **overrides))
    assert code in _errors(report)
    (p,) = [p for p in report.problems if p.code == code][:1]
    assert p.field in overrides or p.field == "target_modules" or p.field == "layers_to_transform"


def test_old_schema_and_duplicates_accepted(tmp_path: Path, base, limits) -> None:
    cfg = {
        "base_model_name_or_path": BASE_NAME,
        "bias": "none",
        "enable_lora": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "merge_weights": False,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": 8,
        "target_modules": ["q_proj", "v_proj", "q_proj"],
        "task_type": "CAUSAL_LM",
    }
    report = _run(tmp_path, base, limits, cfg=cfg)
    assert report.ok and report.problems == [] and report.facts["schema"] == "peft-legacy"


def test_rslora_effective_scaling(tmp_path: Path, base, limits) -> None:
    report = _run(
        tmp_path,
        base,
        limits,
        cfg=peft_config(BASE_NAME, r=16, lora_alpha=32, use_rslora=True),
        tensors=lora_tensors(base, r=16),
    )
    assert report.ok and math.isclose(report.facts["scaling"], 32 / 4)


def test_rank_pattern_effective_ranks(tmp_path: Path, base, limits) -> None:
    cfg = peft_config(
        BASE_NAME,
        target_modules=["q_proj", "v_proj"],
        rank_pattern={"v_proj": 4},
        alpha_pattern={"v_proj": 8},
    )
    report = _run(tmp_path, base, limits, cfg=cfg, tensors=lora_tensors(base, rank_for={"v_proj": 4}))
    assert report.ok and report.facts["effective_ranks"] == {"q_proj": [8], "v_proj": [4]}
    wrong = _run(tmp_path / "w", base, limits, cfg=cfg, tensors=lora_tensors(base))
    assert "tensor_rank_mismatch" in _errors(wrong)


def test_regex_target_and_exclude_resolved(tmp_path: Path, base, limits) -> None:
    cfg = peft_config(
        BASE_NAME,
        target_modules=r"model\.layers\.\d+\.(self_attn|mlp)\.(q_proj|down_proj)",
        exclude_modules=r".*layers\.3\..*",
    )
    tensors = lora_tensors(base, modules=("q_proj", "down_proj"), layers=range(3))
    report = _run(tmp_path, base, limits, cfg=cfg, tensors=tensors)
    assert report.ok and report.facts["target_modules"] == ["down_proj", "q_proj"]
    assert report.facts["targeted_module_count"] == 6
    stray = _run(
        tmp_path / "s", base, limits, cfg=cfg, tensors=lora_tensors(base, modules=("q_proj", "down_proj"))
    )
    assert _errors(stray) == {"tensor_not_targeted"}


def test_layers_to_transform(tmp_path: Path, base, limits) -> None:
    cfg = peft_config(BASE_NAME, layers_to_transform=[1, 2])
    assert _run(tmp_path, base, limits, cfg=cfg, tensors=lora_tensors(base, layers=[1, 2])).ok
    assert _errors(_run(tmp_path / "b", base, limits, cfg=cfg)) == {"tensor_not_targeted"}


def test_fan_in_fan_out_on_linear_is_a_warning(tmp_path: Path, base, limits) -> None:
    report = _run(tmp_path, base, limits, cfg=peft_config(BASE_NAME, fan_in_fan_out=True))
    assert report.ok and report.codes == ["config_fan_in_fan_out_ignored"]


def test_targets_missing_from_base_warned(tmp_path: Path, base, limits) -> None:
    report = _run(
        tmp_path, base, limits, cfg=peft_config(BASE_NAME, target_modules=["q_proj", "v_proj", "fc1"])
    )
    assert report.ok and report.codes == ["target_module_not_in_base"]


# --- 3. tensors against the base ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rename", "code"),
    [
        (
            lambda n: n.replace(".lora_A.weight", ".lora_A.default.weight").replace(
                ".lora_B.weight", ".lora_B.default.weight"
            ),
            "tensor_name_variant",
        ),
        (
            lambda n: n.replace("base_model.model.model.", "base_model.model.model.language_model."),
            "tensor_name_variant",
        ),
        (lambda n: n.replace("base_model.model.model.", "base_model.model."), "tensor_name_variant"),
        (lambda n: n.replace("q_proj", "qkv_proj").replace("v_proj", "gate_up_proj"), "tensor_fused_module"),
        (lambda n: n.replace("self_attn.q_proj", "attention.wq"), "tensor_unmapped"),
        (lambda n: n.replace("layers.3.", "layers.7."), "tensor_layer_out_of_range"),
    ],
)
def test_naming_variants(tmp_path: Path, base, limits, rename, code: str) -> None:
    tensors = {rename(k): v for k, v in lora_tensors(base).items()}
    report = _run(tmp_path, base, limits, tensors=tensors)
    assert code in _errors(report)
    assert all(p.field in tensors for p in report.problems if p.code == code and p.field)


def test_variant_hint_gives_the_canonical_name(tmp_path: Path, base, limits) -> None:
    tensors = {
        k.replace(".lora_A.weight", ".lora_A.default.weight"): v for k, v in lora_tensors(base).items()
    }
    report = _run(tmp_path, base, limits, tensors=tensors)
    p = next(p for p in report.problems if p.code == "tensor_name_variant")
    assert p.hint == f"Rename it to {Q_A} (PEFT `save_pretrained` writes that form)."


def test_names_without_peft_prefix_are_engine_native(tmp_path: Path, base, limits) -> None:
    assert _run(tmp_path, base, limits, tensors=lora_tensors(base, prefix="")).ok


def test_unpaired_and_maps_to_nothing(tmp_path: Path, base, limits) -> None:
    tensors = {Q_A: lora_tensors(base)[Q_A]}
    assert _errors(_run(tmp_path, base, limits, tensors=tensors)) == {
        "tensor_unpaired",
        "adapter_maps_to_nothing",
    }


def test_full_weight_embedding_reports_both_row_counts(tmp_path: Path, base, limits) -> None:
    tensors = {
        **lora_tensors(base),
        "base_model.model.model.embed_tokens.weight": RawTensor("F32", (1030, 256)),
    }
    report = _run(tmp_path, base, limits, tensors=tensors)
    (p,) = [p for p in report.problems if p.code == "tensor_full_weight"]
    assert "1030 rows" in p.message and "1024" in p.message


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_allowed_dtypes(tmp_path: Path, base, limits, dtype: str) -> None:
    report = _run(tmp_path, base, limits, tensors=lora_tensors(base, dtype=dtype))
    assert report.ok and report.facts["dtypes"] == [dtype]


def test_disallowed_dtype(tmp_path: Path, base, limits) -> None:
    tensors = lora_tensors(base)
    tensors[Q_A] = tensors[Q_A].astype(np.float64)
    assert _errors(_run(tmp_path, base, limits, tensors=tensors)) == {"tensor_dtype_not_allowed"}


@pytest.mark.parametrize(("value", "dtype"), [(np.nan, "F32"), (np.inf, "F16"), (-np.inf, "BF16")])
def test_non_finite_values_are_errors(tmp_path: Path, base, limits, value: float, dtype: str) -> None:
    tensors = lora_tensors(base, dtype=dtype)
    a = np.ones((8, 256), np.float32)
    a[3, 7] = value
    tensors[Q_A] = to_bf16(a) if dtype == "BF16" else a.astype(np.float16 if dtype == "F16" else np.float32)
    report = _run(tmp_path, base, limits, tensors=tensors)
    (p,) = [p for p in report.problems if p.code == "tensor_non_finite"]
    assert p.field == Q_A and "1 NaN or Inf" in p.message


def test_zero_b_warnings(tmp_path: Path, base, limits) -> None:
    tensors = lora_tensors(base)
    tensors[Q_B] = -np.zeros_like(tensors[Q_B])  # -0.0 is zero too
    report = _run(tmp_path, base, limits, tensors=tensors)
    assert report.ok and report.codes == ["tensor_all_zero_b"] and report.problems[0].field == Q_B
    untrained = {k: (np.zeros_like(v) if ".lora_B." in k else v) for k, v in lora_tensors(base).items()}
    report = _run(tmp_path / "u", base, limits, tensors=untrained)
    assert report.ok and report.codes == ["adapter_untrained"]


def test_scan_streams_across_chunks(tmp_path: Path) -> None:
    from adapters_app.validation.scan import scan_tensors

    a = np.ones(100_000, np.float32)
    a[-1] = np.nan
    write_safetensors(tmp_path / "x.safetensors", {"a": a, "z": np.zeros(50_000, np.float16)})
    data = (tmp_path / "x.safetensors").read_bytes()
    header, _ = parse_header(io.BytesIO(data), len(data))
    with open(tmp_path / "x.safetensors", "rb") as f:
        stats = scan_tensors(f, header.data_start, header.tensors, chunk_bytes=4096)
    assert [(s.name, s.non_finite, s.all_zero) for s in stats] == [("a", 1, False), ("z", 0, True)]


# --- 4. engine limits per pool ------------------------------------------------------------------------------------


def test_size_above_pool_budget_names_the_setting(tmp_path: Path, base) -> None:
    report = _run(tmp_path, base, PoolLimits(max_lora_rank=16, max_adapter_bytes=10_000))
    (p,) = [p for p in report.problems if p.code == "adapter_too_large"]
    assert "max_adapter_bytes" in p.hint and "10000" in p.message


def test_embedding_lora_needs_the_pool_setting(tmp_path: Path, base) -> None:
    rng = np.random.default_rng(0)
    tensors = {
        **lora_tensors(base),
        "base_model.model.model.embed_tokens.lora_embedding_A": rng.standard_normal(
            (8, 1024), dtype=np.float32
        ),
        "base_model.model.model.embed_tokens.lora_embedding_B": rng.standard_normal(
            (256, 8), dtype=np.float32
        ),
        "base_model.model.lm_head.lora_A.weight": rng.standard_normal((8, 256), dtype=np.float32),
        "base_model.model.lm_head.lora_B.weight": rng.standard_normal((1024, 8), dtype=np.float32),
    }
    cfg = peft_config(BASE_NAME, target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"])
    refused = _run(tmp_path, base, PoolLimits(16, 1 << 30), cfg=cfg, tensors=tensors)
    (p,) = [p for p in refused.problems if p.code == "engine_module_unsupported"]
    assert "allow_embedding_lora" in p.hint and _errors(refused) == {"engine_module_unsupported"}
    allowed = _run(
        tmp_path / "b", base, PoolLimits(16, 1 << 30, allow_embedding_lora=True), cfg=cfg, tensors=tensors
    )
    assert allowed.ok and allowed.facts["lora_pairs"] == 10
