"""Streaming value scan of safetensors tensors in bounded memory.

Reads each tensor's bytes in fixed-size chunks into one reused buffer and
classifies the raw bit patterns with numpy, so memory stays at a few chunk
sizes whatever the file size, and no float conversion is done (bf16 has no
numpy dtype; a bit test works for every float format):

- NaN or Inf: all exponent bits set (IEEE 754; bf16 shares f32's exponent).
- Zero: every bit but the sign is clear (so ``-0.0`` counts as zero).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from adapters_app.validation.safetensors_header import TensorInfo

#: dtype -> (unsigned view, exponent mask, all-but-sign mask)
_FLOAT_BITS: dict[str, tuple[type[np.unsignedinteger], int, int]] = {
    "F16": (np.uint16, 0x7C00, 0x7FFF),
    "BF16": (np.uint16, 0x7F80, 0x7FFF),
    "F32": (np.uint32, 0x7F800000, 0x7FFFFFFF),
    "F64": (np.uint64, 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
}
DEFAULT_CHUNK_BYTES = 4 << 20


class SeekableReader(Protocol):
    """A binary file that supports ``seek`` and ``readinto`` (``open(path, "rb")`` in any buffering mode)."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


@dataclass(frozen=True)
class TensorStats:
    """Value facts about one tensor.

    Attributes:
        name: Tensor name.
        non_finite: Count of NaN/Inf elements.
        all_zero: Whether every element is (signed) zero.
    """

    name: str
    non_finite: int
    all_zero: bool


def scan_tensors(
    f: SeekableReader,
    data_start: int,
    tensors: Iterable[TensorInfo],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[TensorStats]:
    """Scan float tensors' values, streaming.

    Args:
        f: The safetensors file, opened in binary mode (seekable).
        data_start: Absolute offset of the data section (``8 + N``).
        tensors: Entries from a checked header; non-float dtypes are skipped.
        chunk_bytes: Read size in bytes; memory use is about 2× this.

    Returns:
        Stats per scanned tensor, in the given order.

    Raises:
        OSError: If the file cannot be read (it was checked for size before).
        EOFError: If the file is shorter than the header declared (changed on disk).
    """
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    out: list[TensorStats] = []
    for t in tensors:
        spec = _FLOAT_BITS.get(t.dtype)
        if spec is None:
            continue
        utype, exp_mask, mag_mask = spec
        item = np.dtype(utype).itemsize
        step = chunk_bytes - chunk_bytes % item
        scratch = np.empty(step // item, dtype=utype)
        f.seek(data_start + t.begin)
        left = t.nbytes
        non_finite = 0
        nonzero = False
        while left:
            n = min(step, left)
            got = f.readinto(view[:n])
            if got != n:
                raise EOFError(f"tensor {t.name} ends past the end of the file")
            words = np.frombuffer(buf, dtype=utype, count=n // item)
            s = scratch[: words.size]
            np.bitwise_and(words, utype(exp_mask), out=s)
            non_finite += int(np.count_nonzero(s == exp_mask))
            if not nonzero:
                np.bitwise_and(words, utype(mag_mask), out=s)
                nonzero = bool(s.any())
            left -= n
        out.append(TensorStats(t.name, non_finite, not nonzero))
    return out
