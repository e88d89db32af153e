"""The sizing guide (docs/deploy.md §3) is exactly what scripts/sizing.py prints, and the script's model agrees with
the published shapes, the anchors' arithmetic and the manifests' defaults."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quiver_sizing", REPO_ROOT / "scripts" / "sizing.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


sizing = _load()


def test_the_guide_equals_the_script_output() -> None:
    doc = sizing.DOC.read_text()
    assert sizing.section_of(doc) == sizing.render(sizing.Options()), "run: python scripts/sizing.py --write"


def test_a_stale_guide_is_detected() -> None:
    """Negative control: a guide written with other knobs no longer matches."""
    doc = sizing.replace_section(sizing.DOC.read_text(), sizing.render(sizing.Options(max_loras=16)))
    assert sizing.section_of(doc) != sizing.render(sizing.Options())
    with pytest.raises(ValueError, match="sizing"):
        sizing.replace_section("no markers here", "x")


def test_shapes_match_published_parameter_counts_and_the_anchors() -> None:
    small, large = sizing.LLAMA_3_8B, sizing.LLAMA_3_70B
    assert round(small.params / 1e9, 2) == 8.03  # Meta: "8B" = 8.03 B parameters
    assert round(large.params / 1e9, 1) == 70.6  # Meta: "70B" = 70.6 B parameters
    # anchors.md §4: Llama-3-8B all-linear r16 = 80 MiB, r64 = 320 MiB; 70B r16 = 395 MiB; 8B KV 128 KiB/token.
    assert small.adapter_bytes(16) == 80 * MIB and small.adapter_bytes(64) == 320 * MIB
    assert round(large.adapter_bytes(16) / MIB) == 395
    assert small.kv_bytes_per_token() == 128 * 1024


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_a_slot_is_one_padded_adapter_split_over_tp(tp: int) -> None:
    model = sizing.LLAMA_3_70B
    per_gpu = model.slot_bytes_per_gpu(64, tp)
    if tp == 1:
        assert per_gpu == model.adapter_bytes(64)
    # One of A and B is sharded per module, the other replicated: between 1/TP and all of it on each GPU.
    assert model.adapter_bytes(64) / tp <= per_gpu <= model.adapter_bytes(64)
    assert tp == 1 or per_gpu < model.adapter_bytes(64)
    assert model.kv_bytes_per_token(tp) * tp == model.kv_bytes_per_token()


def test_every_node_plan_adds_up() -> None:
    options = sizing.Options()
    plans = [sizing.plan(m, g, r, options) for m in sizing.MODELS for g in sizing.GPUS for r in sizing.RANKS]
    assert sum(p is None for p in plans) == 2  # Llama-3-70B at r64 on 8 x 24 GB
    for p in filter(None, plans):
        assert abs(p.weights + p.overhead + p.lora_slots + p.kv - p.budget) < 1
        assert p.kv_tokens >= sizing.MIN_CONTEXTS * options.max_model_len
        assert p.cpu_adapters >= p.gpu_adapters


def test_defaults_are_the_manifests_defaults() -> None:
    k8s = REPO_ROOT / "platform" / "k8s" / "base"
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    literals = dict(item.split("=", 1) for gen in kustomization["configMapGenerator"] for item in gen["literals"])
    assert int(literals["QUIVER_NODE_CACHE_MAX_BYTES"]) == sizing.DISK_CACHE_GIB * 2**30
    assert int(literals["QUIVER_MAX_LORAS"]) == sizing.MAX_LORAS
    assert int(literals["QUIVER_MAX_MODEL_LEN"]) == sizing.MAX_MODEL_LEN
    assert float(literals["QUIVER_GPU_MEMORY_UTILIZATION"]) == sizing.GPU_MEMORY_UTILIZATION


def test_cli_overrides_a_price_and_rejects_an_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    original = sizing.GPUS
    try:
        assert sizing.main(["--price", "H100-80GB=2.5"]) == 0
        assert "- H100-80GB: 80 GB, $2.5 (--price)" in capsys.readouterr().out
    finally:
        sizing.GPUS = original
    with pytest.raises(SystemExit):
        sizing.main(["--price", "B300=9"])
