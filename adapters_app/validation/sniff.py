"""Recognise files that are not weights at all, by their first bytes.

Common ways a "weights file" goes wrong before any format parsing: an empty
file, a Git LFS pointer committed instead of the object, an HTML error or login
page saved by ``wget``/``curl``, or a ``torch.save`` pickle renamed to
``.safetensors``. Each gets a named problem instead of a parser error.
"""

from __future__ import annotations

from adapters_app.validation.intake import PICKLE_HINT
from adapters_app.validation.problems import Problem, error

SNIFF_BYTES = 512

_LFS_PREFIX = b"version https://git-lfs.github.com/spec/"
_HTML_PREFIXES = (b"<!doctype html", b"<html", b"<head", b"<?xml", b"<body")
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default (zip) format since torch 1.6


def sniff_weights(head: bytes, size: int, name: str) -> Problem | None:
    """Name a weight file that is obviously not safetensors data.

    Args:
        head: The first :data:`SNIFF_BYTES` bytes of the file (fewer if shorter).
        size: The file's size in bytes.
        name: File name used in the problem's ``field``.

    Returns:
        A problem with code ``weights_empty_file``, ``weights_git_lfs_pointer``,
        ``weights_html_page`` or ``pickle_weights``; ``None`` if the file may
        be safetensors.
    """
    if size == 0:
        return error(
            "weights_empty_file",
            name,
            f"{name} is empty (0 bytes).",
            "Upload the real weights file; the copy or download that produced it failed.",
        )
    if head.startswith(_LFS_PREFIX):
        return error(
            "weights_git_lfs_pointer",
            name,
            f"{name} is a Git LFS pointer file ({size} bytes), not the weights.",
            "Run `git lfs pull` in the repository (or download the file through the hub's 'resolve' URL) "
            "and upload the real file.",
        )
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf").lower()  # BOM and whitespace before markup
    if stripped.startswith(_HTML_PREFIXES):
        return error(
            "weights_html_page",
            name,
            f"{name} is an HTML page, not weights (likely an error or login page saved by a download tool).",
            "Download the file again with an authenticated client such as `huggingface-cli download` and check "
            "its size before uploading.",
        )
    # A real safetensors file has '{' right after its 8-byte length, whatever that length's bytes look like.
    looks_safetensors = head[8:9] == b"{"
    is_pickle = head.startswith(_ZIP_MAGIC) or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)
    if is_pickle and not looks_safetensors:
        return error(
            "pickle_weights",
            name,
            f"{name} is a pickle (torch.save) file with a .safetensors name; it is never unpickled.",
            PICKLE_HINT,
        )
    return None
