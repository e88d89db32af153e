"""Small real PEFT adapters for a scale run: one folder per adapter of the trace, shaped for the tiny base model.

Each is a valid LoRA (``adapter_config.json`` + ``adapter_model.safetensors``, random F16 weights on ``q_proj`` and
``v_proj``, as ``devtools.synthetic_adapters`` writes them) whose ``r`` is the trace's (8, 16 or 32: the simulator's
rank mix); the emulated engine charges it as the Llama-3-8B all-linear adapter of that rank (r × 5 MiB: r16 =
80 MiB), the size the simulator charges too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from adapters_app.validation.base_model import BaseModelFacts
from devtools.synthetic_adapters import lora_tensors, peft_config, write_adapter


def adapter_name(i: int) -> str:
    """The served adapter name of trace adapter ``i``."""
    return f"a{i:05d}"


def tenant_slug(t: int) -> str:
    """The slug of trace tenant ``t``."""
    return f"t{t:04d}"


def make_adapters(root: Path, base_dir: Path, served_name: str, ranks: Sequence[int]) -> list[Path]:
    """Write one adapter folder per rank in ``ranks`` under ``root`` (kept between runs: same seed, same bytes).

    Args:
        root: where the folders go.
        base_dir: the tiny base model's folder (its ``config.json`` gives the shapes).
        served_name: the base model's served name (each adapter's ``base_model_name_or_path``).
        ranks: ``r`` of each adapter, in trace order.

    Returns:
        The folders, in order.
    """
    base = BaseModelFacts.from_hf_config(served_name, json.loads((base_dir / "config.json").read_text()))
    folders = []
    for i, r in enumerate(ranks):
        folder = root / f"{adapter_name(i)}-r{r}"
        if not (folder / "adapter_model.safetensors").exists():
            write_adapter(folder, peft_config(served_name, r=r, lora_alpha=2 * r),
                          lora_tensors(base, r=r, dtype="F16", seed=i + 1))
        folders.append(folder)
    return folders
