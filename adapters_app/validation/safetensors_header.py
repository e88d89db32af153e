"""A safetensors header parser that trusts nothing in the file.

Format (huggingface/safetensors ``README.md``, "Format"): 8 bytes little-endian
u64 ``N``, then ``N`` bytes of UTF-8 JSON, then the tensor data. Every rule
below is checked and reported as a :class:`Problem`, never raised:

- ``N`` is bounded by :data:`MAX_HEADER_BYTES` (the reference parser's 100 MB
  limit, ``safetensors/src/tensor.rs`` ``MAX_HEADER_SIZE``) and by the file size.
- The header is strict UTF-8 JSON, an object, with no duplicate keys (a JSON
  parser that keeps the first vs. the last duplicate would load different
  tensors: a parser differential) and no NaN/Infinity literals.
- **Leading whitespace is rejected.** The spec says the header "MUST begin with
  a ``{`` character (0x7B)", while the reference parser (serde_json) accepts
  leading whitespace. We follow the spec: no writer produces leading
  whitespace, so only hand-crafted files are affected, and refusing them keeps
  us no more lenient than any conforming reader. Trailing padding with spaces
  (0x20) is accepted, as the spec allows and the Python writer produces for
  8-byte alignment; other trailing whitespace is rejected for the same reason.
- ``__metadata__`` is an object of string to string.
- Each tensor entry has exactly ``dtype`` (a known dtype), ``shape`` (a list of
  non-negative integers, not booleans) and ``data_offsets`` (``[begin, end]``,
  integers with ``0 <= begin <= end``); ``end - begin`` equals
  ``product(shape) * bits(dtype) / 8``.
- The data sections, sorted by offset, are contiguous from byte 0 without
  overlap, and the last ends exactly at the end of the file (no trailing bytes).
  Data past the file's end means the file was truncated, reported as such.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from adapters_app.validation.problems import Problem, error

MAX_HEADER_BYTES = 100_000_000
MAX_TENSORS = 100_000
MAX_NDIM = 16
_U64_MAX = 2**64 - 1

#: safetensors dtype name -> bits per element (huggingface/safetensors ``Dtype``).
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_MAX_LISTED = 20  # per-entry problems beyond this are summarised, so a hostile header can't flood the report
_HINT_RESAVE = (
    "Re-save the weights with `safetensors.torch.save_file` or PEFT `save_pretrained(safe_serialization=True)`; "
    "the file does not follow the safetensors format."
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a checked header.

    Attributes:
        name: The tensor name (header key).
        dtype: safetensors dtype name, e.g. ``"BF16"``.
        shape: Dimensions, e.g. ``(8, 4096)``.
        begin: Start of the data, in bytes from the start of the data section.
        end: End (exclusive) of the data, in bytes from the start of the data section.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.begin

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.shape)


@dataclass
class SafetensorsHeader:
    """Result of :func:`parse_header` when the header is valid.

    Attributes:
        header_bytes: ``N``, the JSON header length in bytes.
        data_start: Absolute file offset of the data section (``8 + N``).
        tensors: Entries sorted by ``begin`` offset.
        metadata: The ``__metadata__`` string map (empty if absent).
    """

    header_bytes: int
    data_start: int
    tensors: list[TensorInfo] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


class _HeaderError(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def parse_header(
    f: BinaryIO, file_size: int, *, name: str = "adapter_model.safetensors"
) -> tuple[SafetensorsHeader | None, list[Problem]]:
    """Read and check a safetensors header without trusting it.

    Reads at most ``8 + min(N, file_size - 8)`` bytes: O(header), never the data.

    Args:
        f: Binary file positioned at offset 0.
        file_size: The file's size in bytes (from ``stat``, not from the file).
        name: File name used in the problems' ``field``.

    Returns:
        ``(header, [])`` when valid, else ``(None, problems)``. Codes:
        ``safetensors_truncated``, ``safetensors_header_too_large``,
        ``safetensors_header_not_utf8``, ``safetensors_header_not_json``,
        ``safetensors_header_whitespace``, ``safetensors_bad_metadata``,
        ``safetensors_bad_entry``, ``safetensors_unknown_dtype``,
        ``safetensors_bad_shape``, ``safetensors_bad_offsets``,
        ``safetensors_size_mismatch``, ``safetensors_overlap``,
        ``safetensors_gap``, ``safetensors_trailing_bytes``,
        ``safetensors_too_many_tensors``.
    """
    try:
        return _parse(f, file_size, name), []
    except _HeaderError as exc:
        return None, [exc.problem]
    except _EntryErrors as exc:
        return None, exc.problems


class _EntryErrors(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems[0].message)
        self.problems = problems


def _fail(code: str, name: str, message: str, hint: str = _HINT_RESAVE) -> _HeaderError:
    return _HeaderError(error(code, name, message, hint))


def _parse(f: BinaryIO, file_size: int, name: str) -> SafetensorsHeader:
    if file_size < 8:
        raise _fail(
            "safetensors_truncated",
            name,
            f"{name} is {file_size} bytes long, shorter than the 8-byte safetensors length prefix.",
            "Upload the complete file; the transfer was cut short.",
        )
    (n,) = struct.unpack("<Q", f.read(8))
    if n > MAX_HEADER_BYTES:
        raise _fail(
            "safetensors_header_too_large",
            name,
            f"{name} declares a {n}-byte header; the limit is {MAX_HEADER_BYTES} bytes.",
        )
    if n > file_size - 8:
        raise _fail(
            "safetensors_truncated",
            name,
            f"{name} declares a {n}-byte header but only {file_size - 8} bytes follow the length prefix.",
            "Upload the complete file; the transfer was cut short (or this is not a safetensors file).",
        )
    raw = f.read(n)
    if len(raw) != n:
        raise _fail(
            "safetensors_truncated", name, f"{name} ended inside its header.", "Upload the complete file."
        )
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise _fail(
            "safetensors_header_not_utf8", name, f"{name}'s header is not valid UTF-8 (byte {exc.start})."
        ) from exc
    if not text.startswith("{"):
        code = "safetensors_header_whitespace" if text[:1].isspace() else "safetensors_header_not_json"
        raise _fail(code, name, f"{name}'s header does not begin with '{{' as the safetensors spec requires.")
    body = text.rstrip(" ")
    if body != body.rstrip():
        raise _fail(
            "safetensors_header_whitespace",
            name,
            f"{name}'s header is padded with whitespace other than spaces (0x20).",
        )
    doc = _load_json(body, name)
    return _check_doc(doc, n, file_size, name)


def _load_json(body: str, name: str) -> dict[str, Any]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for k, v in items:
            for text in (k, v) if isinstance(v, str) else (k,):
                if not _valid_unicode(text):
                    # Python's json accepts lone-surrogate escapes ("\ud800"); serde_json (the reference) does not.
                    raise _fail(
                        "safetensors_header_not_json",
                        name,
                        f"{name}'s header has a string with an invalid \\u escape (lone surrogate).",
                    )
            if k in d:
                raise _fail("safetensors_bad_entry", name, f"{name}'s header has the key {k[:200]!r} twice.")
            d[k] = v
        return d

    def no_constants(c: str) -> Any:
        raise _fail(
            "safetensors_header_not_json", name, f"{name}'s header contains the non-JSON literal {c}."
        )

    try:
        doc = json.loads(body, object_pairs_hook=pairs, parse_constant=no_constants)
    except _HeaderError:
        raise
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and over-long integer literals.
        raise _fail(
            "safetensors_header_not_json", name, f"{name}'s header is not valid JSON ({str(exc)[:120]})."
        ) from exc
    if not isinstance(doc, dict):
        raise _fail("safetensors_header_not_json", name, f"{name}'s header is JSON but not an object.")
    return doc


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_doc(doc: dict[str, Any], n: int, file_size: int, name: str) -> SafetensorsHeader:
    metadata = doc.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _fail(
            "safetensors_bad_metadata", name, f"{name}'s __metadata__ is not a map of strings to strings."
        )
    if len(doc) > MAX_TENSORS:
        raise _fail(
            "safetensors_too_many_tensors",
            name,
            f"{name} lists {len(doc)} tensors; the limit is {MAX_TENSORS}.",
            "A LoRA adapter has a few thousand tensors at most; upload the adapter, not a full model.",
        )
    problems: list[Problem] = []
    tensors: list[TensorInfo] = []
    for key, entry in doc.items():
        info, problem = _check_entry(key, entry)
        if problem is not None:
            problems.append(problem)
        elif info is not None:
            tensors.append(info)
    if problems:
        raise _EntryErrors(_capped(problems, name))
    data_len = file_size - 8 - n
    tensors.sort(key=lambda t: (t.begin, t.end))
    _check_layout(tensors, data_len, name)
    return SafetensorsHeader(header_bytes=n, data_start=8 + n, tensors=tensors, metadata=dict(metadata))


def _check_entry(key: str, entry: Any) -> tuple[TensorInfo | None, Problem | None]:
    short = key[:200]
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        return None, error(
            "safetensors_bad_entry",
            short,
            f"Header entry {short!r} must be an object with exactly dtype, shape and data_offsets.",
            _HINT_RESAVE,
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        return None, error(
            "safetensors_unknown_dtype",
            short,
            f"Tensor {short!r} has unknown dtype {str(dtype)[:40]!r}.",
            _HINT_RESAVE,
        )
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(d) and d >= 0 for d in shape):
        return None, error(
            "safetensors_bad_shape",
            short,
            f"Tensor {short!r} has shape {str(shape)[:80]}; dimensions must be non-negative integers.",
            _HINT_RESAVE,
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return None, error(
            "safetensors_bad_offsets",
            short,
            f"Tensor {short!r} has data_offsets {str(offsets)[:80]}; expected [begin, end] with 0 <= begin <= end.",
            _HINT_RESAVE,
        )
    bits = _checked_bits(shape, DTYPE_BITS[dtype])
    if bits is None or offsets[1] > _U64_MAX:
        return None, error(
            "safetensors_bad_shape",
            short,
            f"Tensor {short!r} has a shape or offsets beyond 64-bit sizes.",
            _HINT_RESAVE,
        )
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        return None, error(
            "safetensors_size_mismatch",
            short,
            f"Tensor {short!r} ({dtype} {str(shape)[:80]}) needs {bits} bits ({bits // 8} bytes) but its "
            f"data_offsets span {offsets[1] - offsets[0]} bytes.",
            _HINT_RESAVE,
        )
    return TensorInfo(key, dtype, tuple(shape), offsets[0], offsets[1]), None


def _checked_bits(shape: list[int], bits_per_item: int) -> int | None:
    """Size in bits, or None on 64-bit overflow, folding left like the reference
    (``shape.iter().try_fold(1usize, usize::checked_mul)``), so ``[2**40, 2**40, 0]`` overflows before the 0."""
    n = 1
    for d in shape:
        n *= d
        if n > _U64_MAX or d > _U64_MAX:
            return None
    n *= bits_per_item
    return None if n > _U64_MAX else n


def _check_layout(tensors: list[TensorInfo], data_len: int, name: str) -> None:
    expected = 0
    for t in tensors:
        if t.begin < expected:
            raise _fail(
                "safetensors_overlap",
                t.name[:200],
                f"Tensor {t.name[:200]!r} overlaps the previous tensor's data.",
            )
        if t.begin > expected:
            raise _fail(
                "safetensors_gap",
                t.name[:200],
                f"{name} has {t.begin - expected} unused bytes before tensor {t.name[:200]!r}.",
            )
        expected = t.end
    if expected > data_len:
        raise _fail(
            "safetensors_truncated",
            name,
            f"{name} is truncated: its header declares {expected} bytes of tensor data but the file holds {data_len}.",
            "Upload the complete file; the transfer was cut short.",
        )
    if expected < data_len:
        raise _fail(
            "safetensors_trailing_bytes",
            name,
            f"{name} has {data_len - expected} bytes after the last tensor's data.",
        )


def _capped(problems: list[Problem], name: str) -> list[Problem]:
    if len(problems) <= _MAX_LISTED:
        return problems
    rest = len(problems) - _MAX_LISTED
    return problems[:_MAX_LISTED] + [
        error(problems[0].code, name, f"... and {rest} more header entries with problems.", _HINT_RESAVE)
    ]
