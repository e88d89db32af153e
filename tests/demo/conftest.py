"""Fixtures for the demo asset tests: one real build per session, in a temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from peft import PeftModel
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from demo.assets import DemoAssets, ensure_demo_assets
from demo.tiny_model import build_base_model, load_base, one_torch_thread


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Run this package's tiny-model forward passes on one thread (≈10× faster on a busy 2-core box)."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory: pytest.TempPathFactory) -> DemoAssets:
    """A freshly built asset tree (base model + one adapter per task)."""
    return ensure_demo_assets(tmp_path_factory.mktemp("demo") / "assets")


@pytest.fixture(scope="session")
def base(demo_assets: DemoAssets) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The built base model and tokenizer, loaded with transformers (fp32, eval)."""
    return load_base(demo_assets.base_dir)


@pytest.fixture(scope="session")
def adapted(demo_assets: DemoAssets) -> dict[str, PeftModel]:
    """Task name → base model + that adapter, loaded independently with PEFT from disk."""
    models = {}
    for name, path in demo_assets.adapters.items():
        model, _ = load_base(demo_assets.base_dir)
        models[name] = PeftModel.from_pretrained(model, path).eval()
    return models


@pytest.fixture()
def base_dir(tmp_path: Path) -> Path:
    """A base model folder built into a per-test temporary directory."""
    return build_base_model(tmp_path / "base")
