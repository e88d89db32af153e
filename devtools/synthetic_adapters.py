"""Synthetic adapters for tests, the benchmark and the fuzzer (no torch needed).

Writes safetensors files with the layout of the reference writer
(huggingface/safetensors ``py_src/safetensors/numpy.py``): header padded with
spaces to a multiple of 8, tensors contiguous in header-key order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adapters_app.validation.base_model import BaseModelFacts, PoolLimits
from adapters_app.validation.report import ValidationReport
from adapters_app.validation.validate import validate_adapter_dir

#: dtype name -> numpy storage type (BF16 stored as raw uint16 words).
_NP: Mapping[str, Any] = {
    "F16": np.float16,
    "F32": np.float32,
    "BF16": np.uint16,
    "F64": np.float64,
    "I8": np.int8,
    "U8": np.uint8,
    "I32": np.int32,
    "I64": np.int64,
}
TINY_LLAMA_HF_CONFIG: Mapping[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RawTensor:
    """A tensor given as raw little-endian bytes (for dtypes numpy lacks, and for size-only tensors).

    Attributes:
        dtype: safetensors dtype name.
        shape: Dimensions.
        data: The bytes, or ``None`` to write zeros of the right size.
        fill: Byte value used when ``data`` is None.
    """

    dtype: str
    shape: tuple[int, ...]
    data: bytes | None = None
    fill: int = 0


def to_bf16(a: np.ndarray) -> RawTensor:
    """Round-toward-zero bf16 of a float32 array, as a :class:`RawTensor`."""
    words = (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
    return RawTensor("BF16", tuple(a.shape), words.tobytes())


def _describe(t: np.ndarray | RawTensor) -> tuple[str, tuple[int, ...], int]:
    if isinstance(t, RawTensor):
        bits = {"F16": 16, "BF16": 16, "F32": 32, "F64": 64, "I8": 8, "U8": 8, "I32": 32, "I64": 64}[t.dtype]
        return t.dtype, t.shape, math.prod(t.shape) * bits // 8
    rev = {np.dtype(v): k for k, v in _NP.items() if k != "BF16"}
    return rev[t.dtype], tuple(t.shape), t.nbytes


def write_safetensors(
    path: Path,
    tensors: Mapping[str, np.ndarray | RawTensor],
    metadata: Mapping[str, str] | None = None,
    *,
    chunk_bytes: int = 8 << 20,
) -> int:
    """Write a safetensors file, streaming each tensor's data.

    Args:
        path: Output file.
        tensors: Name -> numpy array (F16/F32/F64/int) or :class:`RawTensor`.
        metadata: Optional ``__metadata__`` string map.
        chunk_bytes: Write size for :class:`RawTensor` fills.

    Returns:
        The file size in bytes.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, t in tensors.items():
        dtype, shape, nbytes = _describe(t)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            if isinstance(t, RawTensor):
                _, _, nbytes = _describe(t)
                if t.data is not None:
                    f.write(t.data)
                    continue
                block = bytes([t.fill]) * min(chunk_bytes, nbytes)
                while nbytes:
                    n = min(len(block), nbytes)
                    f.write(block[:n])
                    nbytes -= n
            else:
                f.write(np.ascontiguousarray(t).astype(t.dtype.newbyteorder("<")).tobytes())
    return 8 + len(raw) + offset


def lora_tensors(
    base: BaseModelFacts,
    *,
    r: int = 8,
    modules: Iterable[str] = ("q_proj", "v_proj"),
    layers: Iterable[int] | None = None,
    dtype: str = "F32",
    seed: int = 0,
    rank_for: Mapping[str, int] | None = None,
    prefix: str = "base_model.model.",
) -> dict[str, np.ndarray | RawTensor]:
    """Random LoRA pairs shaped for ``base``, named as PEFT ``save_pretrained`` names them.

    Args:
        base: The base model.
        r: Default rank.
        modules: Per-layer module names to cover.
        layers: Layer indices (default: all).
        dtype: ``"F32"``, ``"F16"`` or ``"BF16"``.
        seed: RNG seed.
        rank_for: Module name -> rank override (like ``rank_pattern``).
        prefix: Name prefix (PEFT writes ``base_model.model.``).

    Returns:
        Name -> tensor, A before B for each module.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray | RawTensor] = {}
    for i in layers if layers is not None else range(base.num_hidden_layers):
        for m in modules:
            shape = base.modules[m]
            rank = (rank_for or {}).get(m, r)
            path = f"{prefix}model.layers.{i}.{base.blocks[m]}.{m}"
            a = rng.standard_normal((rank, shape.in_features), dtype=np.float32) * 0.3
            b = rng.standard_normal((shape.out_features, rank), dtype=np.float32) * 0.3
            for name, arr in ((f"{path}.lora_A.weight", a), (f"{path}.lora_B.weight", b)):
                out[name] = (
                    to_bf16(arr)
                    if dtype == "BF16"
                    else arr.astype(np.float16 if dtype == "F16" else np.float32)
                )
    return out


def peft_config(
    base_model: str | None,
    *,
    r: int = 8,
    lora_alpha: float = 16,
    target_modules: list[str] | tuple[str, ...] | str | None = ("q_proj", "v_proj"),
    **extra: Any,
) -> dict[str, Any]:
    """An ``adapter_config.json`` dict as PEFT 0.18 writes it, with overrides."""
    cfg: dict[str, Any] = {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": lora_alpha,
        "lora_bias": False,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": r,
        "rank_pattern": {},
        "target_modules": target_modules
        if target_modules is None or isinstance(target_modules, str)
        else list(target_modules),
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": None,
        "use_dora": False,
        "use_rslora": False,
    }
    cfg.update(extra)
    return cfg


def write_adapter(
    root: Path, config: Mapping[str, Any] | bytes, tensors: Mapping[str, np.ndarray | RawTensor]
) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` into ``root`` (created)."""
    root.mkdir(parents=True, exist_ok=True)
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    (root / "adapter_config.json").write_bytes(data)
    write_safetensors(root / "adapter_model.safetensors", tensors)
    return root


def validate_synthetic(
    root: Path,
    base: BaseModelFacts,
    limits: PoolLimits,
    config: Mapping[str, Any] | bytes | None = None,
    tensors: Mapping[str, np.ndarray | RawTensor] | None = None,
    *,
    base_model_name: str = "quiver/tiny-llama",
) -> ValidationReport:
    """Write an adapter into ``root / "a"`` (default: a valid PEFT config and matching tensors) and validate it."""
    config = peft_config(base_model_name) if config is None else config
    tensors = lora_tensors(base) if tensors is None else tensors
    return validate_adapter_dir(write_adapter(root / "a", config, tensors), base=base, limits=limits)
