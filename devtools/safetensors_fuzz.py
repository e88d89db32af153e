"""Mutations of safetensors files for fuzzing the header parser (test and ``scripts/fuzz_safetensors_header.py``).

Structure-aware: besides byte flips and truncation, mutations edit the JSON header (dtypes, shapes, offsets,
duplicate keys, literals that differ between JSON parsers) and the length prefix, where parser bugs live.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from devtools.synthetic_adapters import RawTensor

_ODD_VALUES: list[Any] = [
    -1,
    0,
    1,
    2**63,
    2**64 + 1,
    10**400,
    1.5,
    True,
    None,
    "8",
    [],
    {},
    [1, 2, 3],
    float("nan"),
    "F32",
    "A" * 300,
]
_DTYPES = [
    "F16",
    "BF16",
    "F32",
    "F64",
    "I8",
    "U8",
    "BOOL",
    "F4",
    "F6_E2M3",
    "F8_E4M3",
    "C64",
    "X99",
    "",
    "f32",
]


def seed_file(rng: random.Random, *, max_tensors: int = 6) -> bytes:
    """A small valid safetensors file with random tensors (some empty), header space-padded like the reference writer."""
    tensors: dict[str, Any] = {}
    for i in range(rng.randint(1, max_tensors)):
        dtype = rng.choice(["F16", "BF16", "F32"])
        shape = tuple(rng.randint(0, 5) for _ in range(rng.randint(0, 3)))
        tensors[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{'AB'[i % 2]}.weight"] = RawTensor(
            dtype, shape, fill=rng.randint(0, 255)
        )
    return _render(tensors, {"format": "pt"} if rng.random() < 0.5 else None)


def _render(tensors: dict[str, Any], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    data = bytearray()
    for name, t in tensors.items():
        size = int(np.prod(t.shape, dtype=np.int64)) * (2 if t.dtype in ("F16", "BF16") else 4)
        header[name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [len(data), len(data) + size],
        }
        data += bytes([t.fill]) * size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(data)


def _split(data: bytes) -> tuple[int, bytes, bytes]:
    n = int.from_bytes(data[:8].ljust(8, b"\0"), "little")
    return n, data[8 : 8 + n], data[8 + n :]


def _with_header(data: bytes, header: bytes, *, fix_length: bool = True) -> bytes:
    n, _, rest = _split(data)
    return (len(header) if fix_length else n).to_bytes(8, "little") + header + rest


def _edit_json(data: bytes, rng: random.Random) -> bytes:
    _, raw, _ = _split(data)
    try:
        doc = json.loads(raw)
    except ValueError:
        return data
    if not isinstance(doc, dict):
        return data
    names = [k for k in doc if k != "__metadata__"]
    if not names:
        return data
    entry = doc[rng.choice(names)]
    if not isinstance(entry, dict):
        return data
    try:
        _apply_edit(doc, names, entry, rng)
    except (TypeError, IndexError, KeyError, AttributeError):
        return data  # an earlier mutation already broke this entry's structure
    text = json.dumps(doc, allow_nan=True)
    return _with_header(data, text.encode(), fix_length=rng.random() < 0.9)


def _apply_edit(doc: dict[str, Any], names: list[str], entry: dict[str, Any], rng: random.Random) -> None:
    op = rng.randrange(8)
    if op == 0:
        entry["dtype"] = rng.choice(_DTYPES)
    elif op == 1 and entry.get("shape"):
        entry["shape"][rng.randrange(len(entry["shape"]))] = rng.choice(_ODD_VALUES)
    elif op == 2:
        entry["data_offsets"][rng.randrange(2)] = rng.choice(
            [*_ODD_VALUES, entry["data_offsets"][0] + rng.randint(-9, 9)]
        )
    elif op == 3:
        entry[rng.choice(["extra", "dtype", "shape"])] = rng.choice(_ODD_VALUES)
    elif op == 4:
        entry.pop(rng.choice(["dtype", "shape", "data_offsets"]), None)
    elif op == 5:
        doc["__metadata__"] = rng.choice([{"a": 1}, ["x"], "s", {"k": "v"}, None])
    elif op == 6:
        entry["shape"] = [rng.randint(0, 2**40) for _ in range(rng.randint(0, 20))]
    else:
        doc[rng.choice(names)] = rng.choice(_ODD_VALUES)


def _duplicate_key(data: bytes, rng: random.Random) -> bytes:
    _, raw, _ = _split(data)
    text = raw.decode("utf-8", "replace").rstrip()
    if not text.endswith("}") or "{" not in text[1:]:
        return data
    first = text[1:].split("},", 1)[0] + "}"
    return _with_header(data, (text[:-1] + "," + first + "}").encode())


def _whitespace(data: bytes, rng: random.Random) -> bytes:
    _, raw, _ = _split(data)
    pad = rng.choice([b" ", b"\n", b"\t", b"\r\n", b"\xc2\xa0"])
    return _with_header(data, pad + raw if rng.random() < 0.5 else raw + pad)


def _length(data: bytes, rng: random.Random) -> bytes:
    n, _, _ = _split(data)
    new = rng.choice(
        [
            0,
            1,
            n - 1,
            n + 1,
            n + 8,
            len(data),
            len(data) - 7,
            2**63,
            2**64 - 1,
            100_000_001,
            rng.randrange(2**64),
        ]
    )
    return (new % 2**64).to_bytes(8, "little") + data[8:]


def _flip(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _append(data: bytes, rng: random.Random) -> bytes:
    return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))


def _splice_text(data: bytes, rng: random.Random) -> bytes:
    _, raw, _ = _split(data)
    snippets = [
        b"NaN",
        b"Infinity",
        b"1e999",
        b"-0",
        b"[[[[[[[[",
        b"\\ud800",
        b'"\x00"',
        b"\xff\xfe",
        b"{}",
        b"9" * 5000,
    ]
    if not raw:
        return data
    i = rng.randrange(len(raw))
    return _with_header(data, raw[:i] + rng.choice(snippets) + raw[i:])


MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    _edit_json,
    _duplicate_key,
    _whitespace,
    _length,
    _flip,
    _truncate,
    _append,
    _splice_text,
]


def mutate(data: bytes, rng: random.Random, *, rounds: int | None = None) -> bytes:
    """Apply 1-3 random mutations (or ``rounds``) to a safetensors file's bytes."""
    for _ in range(rounds if rounds is not None else rng.randint(1, 3)):
        data = rng.choice(MUTATIONS)(data, rng)
    return data
