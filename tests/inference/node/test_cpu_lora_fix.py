"""The CPU base-row fix, in pure torch (no engine): vllm-project/vllm PR #49656."""

from __future__ import annotations

import types

import pytest
import torch
import vllm.lora.ops.torch_ops as torch_ops_pkg
import vllm.lora.ops.torch_ops.lora_ops as lora_ops
import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

from inference.node import cpu_lora_fix

ORIGINAL = lora_ops.bgmv_shrink.__dict__.get("__wrapped__", lora_ops.bgmv_shrink)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen)  # 4 tokens, hidden 8
    lora_a = torch.randn(2, 1, 3, 8, generator=gen)  # max_loras 2, rank 3 (vLLM's stacked layout)
    indices = torch.tensor([-1, 0, 1, -1])
    return x, lora_a, indices


def test_stock_shrink_gives_base_rows_the_last_slot() -> None:
    x, lora_a, indices = _inputs()
    out = torch.zeros(4, 3)

    ORIGINAL(x, lora_a, out, indices, 1.0)

    # The bug: index -1 wraps to slot 1, so base rows get adapter 1's shrink.
    torch.testing.assert_close(out[0], x[0] @ lora_a[1, 0].T)
    assert out[0].abs().sum() > 0


def test_fixed_shrink_zeroes_negative_rows_and_keeps_the_others() -> None:
    x, lora_a, indices = _inputs()
    expected = torch.zeros(4, 3)
    ORIGINAL(x, lora_a, expected, indices, 0.5)
    out = torch.full((4, 3), 7.0)

    cpu_lora_fix.make_fixed_bgmv_shrink(ORIGINAL)(x, lora_a, out, indices, 0.5)

    assert torch.equal(out[0], torch.zeros(3))
    assert torch.equal(out[3], torch.zeros(3))
    torch.testing.assert_close(out[1:3], expected[1:3])
    torch.testing.assert_close(out[1], 0.5 * x[1] @ lora_a[0, 0].T)


def test_padded_index_tensor_longer_than_output_is_handled() -> None:
    out = torch.ones(2, 3)
    cpu_lora_fix.zero_no_lora_rows(out, torch.tensor([0, -1, -1, -1]))
    assert out.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_wrapping_is_idempotent() -> None:
    once = cpu_lora_fix.make_fixed_bgmv_shrink(ORIGINAL)
    assert cpu_lora_fix.make_fixed_bgmv_shrink(once) is once
    module = types.SimpleNamespace(bgmv_shrink=ORIGINAL)
    assert cpu_lora_fix.patch_modules({"m": module}) == 1  # type: ignore[dict-item]
    bound = module.bgmv_shrink
    assert cpu_lora_fix.patch_modules({"m": module}) == 0  # type: ignore[dict-item]
    assert module.bgmv_shrink is bound


@pytest.fixture
def stock_vllm_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the stock function back in all three modules; monkeypatch restores them afterwards."""
    for module in (lora_ops, torch_ops_pkg, punica_cpu):
        monkeypatch.setattr(module, "bgmv_shrink", ORIGINAL)


@pytest.mark.usefixtures("stock_vllm_bindings")
def test_register_rebinds_every_binding_once_and_fixes_prefill_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_lora_fix.DISABLE_ENV, raising=False)

    cpu_lora_fix.register()
    cpu_lora_fix.register()

    bound = {id(m.bgmv_shrink) for m in (lora_ops, torch_ops_pkg, punica_cpu)}
    assert len(bound) == 1
    assert lora_ops.bgmv_shrink.__wrapped__ is ORIGINAL
    # Prefill's sgmv_shrink looks bgmv_shrink up in lora_ops' globals: sequence 0 is base, 1 is slot 0.
    x, lora_a, _ = _inputs()
    out = torch.full((4, 3), 7.0)
    lora_ops.sgmv_shrink(
        x, lora_a, out, torch.tensor([0, 2]), torch.tensor([2, 2]), torch.tensor([-1, 0]), 2, 2, 4, 1.0
    )
    assert torch.equal(out[:2], torch.zeros(2, 3))
    torch.testing.assert_close(out[2], x[2] @ lora_a[0, 0].T)


@pytest.mark.usefixtures("stock_vllm_bindings")
def test_env_switch_disables_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_lora_fix.DISABLE_ENV, "1")

    cpu_lora_fix.register()

    assert lora_ops.bgmv_shrink is ORIGINAL
    assert punica_cpu.bgmv_shrink is ORIGINAL


@pytest.mark.usefixtures("stock_vllm_bindings")
def test_register_is_a_no_op_off_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_lora_fix.DISABLE_ENV, raising=False)
    monkeypatch.setattr(cpu_lora_fix, "_is_cpu_platform", lambda: False)

    cpu_lora_fix.register()

    assert lora_ops.bgmv_shrink is ORIGINAL
