"""vLLM general plugin: stop base-model rows from picking up a LoRA on CPU.

vLLM's CPU punica wrapper (`vllm/lora/punica_wrapper/punica_cpu.py`) runs the torch ops in
`vllm/lora/ops/torch_ops/lora_ops.py`. Their `bgmv_shrink` gathers `lora_weights[lora_indices]`,
and the "no LoRA" index -1 wraps around to the last slot, so a base-model request batched with
LoRA requests silently gets the adapter in slot `max_loras - 1`. The GPU Triton kernels skip -1.
Upstream fix: vllm-project/vllm PR #49656 ("[Bugfix][CPU] Fix LoRA no-op row aliasing in
PunicaWrapperCPU", building on PR #48421). Drop this plugin once a pinned vLLM release has it.

The plugin is registered as the `vllm.general_plugins` entry point `quiver_cpu_lora_fix` in
pyproject.toml, so vLLM calls `register()` in every process (API server, EngineCore, Worker).
If `VLLM_PLUGINS` is set it must list `quiver_cpu_lora_fix`.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

# A child of vLLM's "vllm" logger, so the message shows in every engine process's log with vLLM's handler.
logger = logging.getLogger("vllm.plugins.quiver_cpu_lora_fix")

DISABLE_ENV = "QUIVER_DISABLE_CPU_LORA_FIX"
_MARKER = "__quiver_cpu_lora_fix__"

# Every module that binds the name `bgmv_shrink` at import time. `lora_ops` must be patched because
# its `sgmv_shrink` (prefill) looks the name up in its own globals; `punica_cpu` imported the name
# from the package re-export, so decode and logits paths use its binding.
_BINDING_MODULES = (
    "vllm.lora.ops.torch_ops.lora_ops",
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)


def zero_no_lora_rows(output_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor) -> None:
    """Zero, in place, the rows of a shrink output whose LoRA index is negative.

    Args:
        output_tensor: shrink output, shape `[num_tokens, rank]` (extra trailing dims allowed).
        lora_indices_tensor: per-token slot index, shape `[num_tokens]` (may be longer than the
            output when the batch is padded); -1 means "no LoRA".
    """
    rows = min(output_tensor.shape[0], lora_indices_tensor.shape[0])
    mask = lora_indices_tensor[:rows] < 0
    if not bool(mask.any()):
        return
    mask = mask.view(rows, *([1] * (output_tensor.dim() - 1)))
    output_tensor[:rows].masked_fill_(mask, 0)


def make_fixed_bgmv_shrink(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a `bgmv_shrink` so rows with LoRA index < 0 come out as zeros.

    The expand step then adds nothing to those rows, which is what the GPU kernels do.

    Args:
        original: vLLM's `bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor,
            scaling=1.0)` (`vllm/lora/ops/torch_ops/lora_ops.py`).

    Returns:
        A function with the same signature; returned unchanged if `original` is already wrapped.
    """
    if getattr(original, _MARKER, False):
        return original

    def bgmv_shrink(
        inputs: torch.Tensor,
        lora_b_weights: torch.Tensor,
        output_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        scaling: float = 1.0,
    ) -> None:
        original(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        zero_no_lora_rows(output_tensor, lora_indices_tensor)

    bgmv_shrink.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(bgmv_shrink, _MARKER, True)
    return bgmv_shrink


def patch_modules(modules: dict[str, ModuleType]) -> int:
    """Rebind `bgmv_shrink` to the fixed wrapper in every given module.

    Args:
        modules: module name -> module object, each expected to bind `bgmv_shrink`.

    Returns:
        How many modules were (re)bound; 0 when all were already patched.
    """
    patched = 0
    # One wrapper per distinct original, so every binding points at the same function object.
    wrappers: dict[int, Callable[..., Any]] = {}
    for module in modules.values():
        current = getattr(module, "bgmv_shrink", None)
        if current is None or getattr(current, _MARKER, False):
            continue
        wrapper = wrappers.setdefault(id(current), make_fixed_bgmv_shrink(current))
        module.bgmv_shrink = wrapper  # type: ignore[attr-defined]
        patched += 1
    return patched


def _is_cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def register() -> None:
    """vLLM general-plugin entry point: install the CPU base-row fix (idempotent).

    Does nothing when `QUIVER_DISABLE_CPU_LORA_FIX=1` (so a test can show the bug), when the
    platform is not CPU, or when the torch LoRA ops are absent from the installed vLLM.
    """
    if os.environ.get(DISABLE_ENV, "") == "1":
        logger.warning("cpu_lora_fix.disabled", extra={"env": DISABLE_ENV})
        return
    if not _is_cpu_platform():
        return
    modules: dict[str, ModuleType] = {}
    for name in _BINDING_MODULES:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError:
            logger.info("cpu_lora_fix.module_absent", extra={"module": name})
    patched = patch_modules(modules)
    if patched:
        logger.info("cpu_lora_fix.installed", extra={"pid": os.getpid(), "modules": patched})
