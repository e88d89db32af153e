"""Fixtures for the validator tests: a tiny Llama base and pool limits. No database."""

from __future__ import annotations

import pytest

from adapters_app.validation import BaseModelFacts, PoolLimits
from devtools.synthetic_adapters import TINY_LLAMA_HF_CONFIG

BASE_NAME = "quiver/tiny-llama"


@pytest.fixture
def base() -> BaseModelFacts:
    return BaseModelFacts.from_hf_config(BASE_NAME, TINY_LLAMA_HF_CONFIG)


@pytest.fixture
def limits() -> PoolLimits:
    return PoolLimits(max_lora_rank=16, max_adapter_bytes=64 << 20)
