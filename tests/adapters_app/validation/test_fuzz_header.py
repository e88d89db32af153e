"""Property-based fuzzing of the safetensors header parser (bounded; scripts/fuzz_safetensors_header.py runs longer).

Properties: never raises, never reads the data section, and whatever it accepts the reference parser
(safetensors' Rust ``deserialize``) accepts too, with the same names, dtypes and shapes (we are never more lenient).
"""

from __future__ import annotations

import io
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors._safetensors_rust import SafetensorError, deserialize

from adapters_app.validation.safetensors_header import parse_header
from devtools.safetensors_fuzz import mutate, seed_file

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse(data: bytes):
    header, problems = parse_header(io.BytesIO(data), len(data))
    assert (header is None) == bool(problems)
    assert all(p.severity == "error" and p.code.startswith("safetensors_") for p in problems)
    return header


def _check_accepted(data: bytes) -> None:
    header = _parse(data)
    if header is None:
        return
    # Invariants of an accepted header.
    pos = 0
    for t in header.tensors:
        assert t.begin == pos and t.end >= t.begin
        pos = t.end
    assert header.data_start + pos == len(data)
    # Differential: the reference parser agrees.
    try:
        ref = deserialize(data)
    except SafetensorError as exc:  # pragma: no cover - a failure here is a finding
        raise AssertionError(f"we accepted a file the reference rejects: {exc}") from exc
    assert {n: (d["dtype"], list(d["shape"])) for n, d in ref} == {
        t.name: (t.dtype, list(t.shape)) for t in header.tensors
    }


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes(data: bytes) -> None:
    _check_accepted(data)


@FUZZ
@given(st.integers(0, 2**32), st.integers(1, 4))
def test_mutated_valid_files(seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    _check_accepted(mutate(seed_file(rng), rng, rounds=rounds))


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_entry = (
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F16", "BF16", "F32", "I8", "F4", "BOOL", "Q4"]),
            "shape": st.lists(st.integers(-2, 6), max_size=3),
            "data_offsets": st.lists(st.integers(-2, 300), min_size=0, max_size=3),
        }
    )
    | _json
)


@FUZZ
@given(
    st.dictionaries(st.text(min_size=1, max_size=12), _entry, max_size=5),
    st.binary(max_size=300),
    st.sampled_from([b"", b" " * 3, b"\n"]),
)
def test_structured_headers(doc: dict, data: bytes, pad: bytes) -> None:
    raw = json.dumps(doc).encode() + pad
    _check_accepted(len(raw).to_bytes(8, "little") + raw + data)


def test_leading_whitespace_decision_documented() -> None:
    """The reference parser accepts leading whitespace; the spec says the header MUST begin with '{'. We follow the spec."""
    data = b"\x03" + b"\x00" * 7 + b" {}"
    assert deserialize(data) == []
    header, problems = parse_header(io.BytesIO(data), len(data))
    assert header is None and [p.code for p in problems] == ["safetensors_header_whitespace"]
    padded = (
        b"\x08" + b"\x00" * 7 + b"{}      "
    )  # trailing spaces: allowed by the spec, written by the reference writer
    assert parse_header(io.BytesIO(padded), len(padded))[0] is not None


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.integers(0, 2**32))
def test_gate_never_raises_on_mutated_weights(tmp_path_factory, seed: int) -> None:
    """The whole gate turns any mutated weights file into problems, never an exception."""
    from adapters_app.validation import BaseModelFacts, PoolLimits, validate_adapter_dir
    from devtools.synthetic_adapters import (
        TINY_LLAMA_HF_CONFIG,
        lora_tensors,
        peft_config,
        write_adapter,
    )

    rng = random.Random(seed)
    base = BaseModelFacts.from_hf_config("quiver/tiny-llama", TINY_LLAMA_HF_CONFIG)
    root = write_adapter(
        tmp_path_factory.mktemp("g"), peft_config("quiver/tiny-llama"), lora_tensors(base, layers=[0])
    )
    weights = root / "adapter_model.safetensors"
    weights.write_bytes(mutate(weights.read_bytes(), rng))
    report = validate_adapter_dir(root, base=base, limits=PoolLimits(16, 1 << 20))
    assert all(p.message and p.hint for p in report.problems)
    if report.ok:  # only mutations that kept a well-formed adapter (e.g. a metadata edit) may pass
        assert report.facts["lora_pairs"] == 2
    json.dumps(report.to_dict())
