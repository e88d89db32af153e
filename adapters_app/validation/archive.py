"""Safe reading of uploaded adapter archives (zip, tar, tar.gz/.bz2/.xz).

Nothing here trusts the archive: names are normalised and checked before any
byte is yielded, links and devices are refused, member count and total size
are capped from the headers *and* re-counted while streaming (a zip's
declared sizes can lie; zipfile stops at the declared size and checks the CRC,
and we stop at our own count). Nothing is ever written outside the caller's
destination because names with ``..`` or absolute paths are rejected, not
rewritten (CPython's tarfile extraction filters, PEP 706, are not used since
we never call ``extract``).
"""

from __future__ import annotations

import functools
import io
import logging
import lzma
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

from adapters_app.validation.intake import CONFIG_NAME, folder_problems, is_junk
from adapters_app.validation.problems import Problem, UploadRejected, error

logger = logging.getLogger(__name__)

_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # local file header, empty-archive EOCD
_COMPRESSED_TAR_MAGICS = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz
_ZIP_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA})
_READ_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    OSError,
    zlib.error,
    lzma.LZMAError,
    ValueError,
)
_DRIVE = re.compile(r"^[A-Za-z]:")
_ARCHIVE_HINT = "Upload a .zip or .tar.gz of the single adapter folder written by PEFT `save_pretrained`."


@dataclass(frozen=True)
class ArchiveMember:
    """One regular file of the adapter folder inside an archive.

    Attributes:
        name: Posix path relative to the adapter folder, e.g. ``"adapter_config.json"``.
        size: Uncompressed size in bytes as declared by the archive (the reader
            enforces it).
    """

    name: str
    size: int
    _opener: Callable[[], BinaryIO] = field(repr=False, compare=False)

    def open(self) -> BinaryIO:
        """Return a streaming reader of the member's bytes.

        Valid only while the :func:`iter_archive` generator that produced the
        member is alive. ``read()`` raises :class:`UploadRejected`
        (``archive_too_large``, ``archive_corrupt``) when the real bytes exceed
        the declared size or the caps, or the data is damaged.
        """
        return self._opener()


@dataclass
class _Entry:
    raw_name: str
    kind: str  # "file" | "dir" | "link" | "special"
    size: int
    handle: object  # ZipInfo or TarInfo


class _Budget:
    """Running count of real uncompressed bytes across all members."""

    def __init__(self, max_total_bytes: int) -> None:
        self.max_total_bytes = max_total_bytes
        self.used = 0

    def consume(self, n: int) -> None:
        self.used += n
        if self.used > self.max_total_bytes:
            raise UploadRejected([_too_large(self.max_total_bytes, "the bytes actually stored")])


class _CountingReader(io.RawIOBase):
    """Reader that enforces a member's declared size and the archive budget."""

    def __init__(self, raw: IO[bytes], name: str, declared: int, budget: _Budget) -> None:
        self._raw = raw
        self._name = name
        self._declared = declared
        self._budget = budget
        self._count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            data = self._raw.read(len(b))
        except _READ_ERRORS as exc:
            raise UploadRejected([_corrupt(self._name, exc)]) from exc
        n = len(data)
        self._count += n
        if self._count > self._declared:
            raise UploadRejected(
                [
                    error(
                        "archive_size_mismatch",
                        self._name,
                        f"{self._name} holds more bytes than its archive header declares ({self._declared}).",
                        _ARCHIVE_HINT,
                    )
                ]
            )
        self._budget.consume(n)
        b[:n] = data
        return n

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def iter_archive(path: Path, *, max_members: int, max_total_bytes: int) -> Iterator[ArchiveMember]:
    """Yield the files of the single adapter folder inside an archive.

    The format is detected from the content, not the file name: zip, or tar
    (plain, gzip, bzip2, xz). Every structural check runs before the first
    member is yielded. Directory entries and archiver junk (``__MACOSX/``,
    ``.DS_Store``, ``._*``) are skipped. Files may sit at the top level or
    inside exactly one top folder, which is stripped from the names.

    Args:
        path: The uploaded archive on local disk.
        max_members: Cap on archive entries of any kind (directories and junk
            included), e.g. 1000.
        max_total_bytes: Cap on total uncompressed bytes, checked against the
            declared sizes first and the real streamed bytes later.

    Yields:
        ArchiveMember per regular file, in archive order.

    Raises:
        UploadRejected: ``archive_unknown_format``, ``archive_corrupt``,
            ``archive_too_many_members``, ``archive_too_large``,
            ``archive_absolute_path``, ``archive_path_traversal``,
            ``archive_bad_name``, ``archive_link``, ``archive_special_file``,
            ``archive_encrypted``, ``archive_unsupported_compression``,
            ``archive_duplicate_name``, ``archive_empty``,
            ``archive_multiple_folders``, ``archive_multiple_adapters``,
            plus the folder checks of :func:`check_upload_names`
            (``pickle_weights``, ``missing_adapter_config``,
            ``missing_adapter_weights``). While streaming, readers may raise
            ``archive_too_large``, ``archive_size_mismatch`` or ``archive_corrupt``.
        ValueError: If a cap is not positive (programming error).
    """
    if max_members <= 0 or max_total_bytes <= 0:
        raise ValueError("max_members and max_total_bytes must be positive")
    kind = _detect(path)
    budget = _Budget(max_total_bytes)
    if kind == "zip":
        declared = zip_declared_entries(path)
        if declared is not None:
            _check_count(declared, max_members)  # before zipfile parses (and allocates) the central directory
        try:
            zf = zipfile.ZipFile(path)
        except _READ_ERRORS as exc:
            raise UploadRejected([_corrupt(None, exc)]) from exc
        with zf:
            entries = _zip_entries(zf, max_members, max_total_bytes)
            for name, entry in _plan(entries):
                info = entry.handle
                assert isinstance(info, zipfile.ZipInfo)
                yield ArchiveMember(
                    name, entry.size, _opener_for(functools.partial(zf.open, info), name, entry.size, budget)
                )
    else:
        try:
            tf = tarfile.open(path, "r:*")
        except _READ_ERRORS as exc:
            raise UploadRejected([_corrupt(None, exc)]) from exc
        with tf:
            entries = _tar_entries(tf, max_members, max_total_bytes)
            for name, entry in _plan(entries):
                ti = entry.handle
                assert isinstance(ti, tarfile.TarInfo)
                yield ArchiveMember(
                    name,
                    entry.size,
                    _opener_for(functools.partial(_tar_open, tf, ti), name, entry.size, budget),
                )


def extract_archive(
    path: Path, dest: Path, *, max_members: int, max_total_bytes: int, chunk_bytes: int = 1 << 20
) -> list[str]:
    """Extract the adapter folder of an archive into ``dest`` with :func:`iter_archive`'s checks.

    Args:
        path: The uploaded archive.
        dest: An existing, empty directory; files land at ``dest / member.name``.
        max_members: See :func:`iter_archive`.
        max_total_bytes: See :func:`iter_archive`.
        chunk_bytes: Copy buffer size in bytes (memory stays bounded by it).

    Returns:
        The extracted member names, in archive order.

    Raises:
        UploadRejected: As :func:`iter_archive`; files written so far stay in
            ``dest`` for the caller to remove.
    """
    names: list[str] = []
    for member in iter_archive(path, max_members=max_members, max_total_bytes=max_total_bytes):
        target = dest.joinpath(*member.name.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with member.open() as src, open(target, "xb") as out:
            while chunk := src.read(chunk_bytes):
                out.write(chunk)
        names.append(member.name)
    return names


def _detect(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise UploadRejected([_corrupt(None, exc)]) from exc
    if head.startswith(_ZIP_MAGICS):
        return "zip"
    if head.startswith(_COMPRESSED_TAR_MAGICS) or head[257:262] == b"ustar":
        return "tar"
    # A pre-POSIX (v7) tar has no magic; let tarfile decide, it checks the header checksum.
    if len(head) == 512:
        try:
            with tarfile.open(path, "r:"):
                return "tar"
        except _READ_ERRORS:
            pass
    raise UploadRejected(
        [
            error(
                "archive_unknown_format",
                None,
                "The archive is neither a zip nor a tar (plain, .gz, .bz2 or .xz) file.",
                _ARCHIVE_HINT,
            )
        ]
    )


def _zip_entries(zf: zipfile.ZipFile, max_members: int, max_total_bytes: int) -> list[_Entry]:
    infos = zf.infolist()
    _check_count(len(infos), max_members)
    entries: list[_Entry] = []
    problems: list[Problem] = []
    declared = 0
    for info in infos:
        mode = (info.external_attr >> 16) & 0xFFFF
        if info.is_dir():
            kind = "dir"
        elif stat.S_ISLNK(mode):
            kind = "link"
        elif mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            kind = "special"
        else:
            kind = "file"
        if kind == "file":
            if info.flag_bits & 0x1:
                problems.append(
                    error(
                        "archive_encrypted",
                        info.filename,
                        f"{info.filename} is encrypted.",
                        "Upload an archive without a password.",
                    )
                )
            if info.compress_type not in _ZIP_METHODS:
                problems.append(
                    error(
                        "archive_unsupported_compression",
                        info.filename,
                        f"{info.filename} uses zip compression method {info.compress_type}, which is not supported.",
                        "Re-create the zip with the standard deflate method (the default of `zip` and most tools).",
                    )
                )
            declared += info.file_size
        entries.append(_Entry(info.filename, kind, info.file_size, info))
    if declared > max_total_bytes:
        problems.append(_too_large(max_total_bytes, "the sizes declared in the archive"))
    if problems:
        raise UploadRejected(problems)
    return entries


def _tar_entries(tf: tarfile.TarFile, max_members: int, max_total_bytes: int) -> list[_Entry]:
    entries: list[_Entry] = []
    declared = 0
    try:
        while (ti := tf.next()) is not None:
            _check_count(len(entries) + 1, max_members)
            if ti.isreg() and not ti.issparse():
                kind = "file"
                declared += ti.size
                if declared > max_total_bytes:
                    # Stop before tarfile skips (decompresses) the oversized data.
                    raise UploadRejected([_too_large(max_total_bytes, "the sizes declared in the archive")])
            elif ti.isdir():
                kind = "dir"
            elif ti.issym() or ti.islnk():
                kind = "link"
            else:
                kind = "special"
            entries.append(_Entry(ti.name, kind, ti.size, ti))
    except _READ_ERRORS as exc:
        raise UploadRejected([_corrupt(None, exc)]) from exc
    return entries


def _plan(entries: list[_Entry]) -> list[tuple[str, _Entry]]:
    """Check names and structure; return (stripped name, entry) for each file to yield."""
    problems: list[Problem] = []
    files: list[tuple[tuple[str, ...], _Entry]] = []
    seen: set[tuple[str, ...]] = set()
    for entry in entries:
        parts, problem = _normalise(entry.raw_name)
        if problem is not None:
            problems.append(problem)
            continue
        if entry.kind == "link":
            problems.append(
                error(
                    "archive_link",
                    entry.raw_name,
                    f"{entry.raw_name} is a symbolic or hard link.",
                    "Archive the real files; links are refused because they can point outside the adapter.",
                )
            )
            continue
        if entry.kind == "special":
            problems.append(
                error(
                    "archive_special_file",
                    entry.raw_name,
                    f"{entry.raw_name} is a device, FIFO or other special file.",
                    "Archive only regular files.",
                )
            )
            continue
        if entry.kind == "dir" or not parts or is_junk(parts):
            continue
        if parts in seen:
            problems.append(
                error(
                    "archive_duplicate_name",
                    "/".join(parts),
                    f"{'/'.join(parts)} appears more than once in the archive.",
                    "Re-create the archive from the folder so each file appears once.",
                )
            )
            continue
        seen.add(parts)
        files.append((parts, entry))
    if problems:
        raise UploadRejected(problems)
    if not files:
        raise UploadRejected([error("archive_empty", None, "The archive contains no files.", _ARCHIVE_HINT)])
    tops = {parts[0] for parts, _ in files}
    if all(len(parts) > 1 for parts, _ in files):
        if len(tops) > 1:
            raise UploadRejected(
                [
                    error(
                        "archive_multiple_folders",
                        None,
                        f"The archive holds several top-level folders ({', '.join(sorted(tops)[:5])}).",
                        "Upload exactly one adapter folder, or put its files at the top of the archive.",
                    )
                ]
            )
        files = [(parts[1:], entry) for parts, entry in files]
    names = ["/".join(parts) for parts, _ in files]
    config_dirs = sorted(
        {n.rsplit("/", 1)[0] if "/" in n else "." for n in names if n.rsplit("/", 1)[-1] == CONFIG_NAME}
    )
    if len(config_dirs) > 1:
        problems.append(
            error(
                "archive_multiple_adapters",
                CONFIG_NAME,
                f"adapter_config.json appears in several folders ({', '.join(config_dirs[:5])}).",
                "Upload one adapter per archive (e.g. only the final checkpoint folder).",
            )
        )
    problems.extend(folder_problems(names))
    if problems:
        raise UploadRejected(problems)
    return list(zip(names, (entry for _, entry in files), strict=True))


def _normalise(raw: str) -> tuple[tuple[str, ...], Problem | None]:
    """Split an archive name into safe parts, or explain why it is unsafe."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        return (), error(
            "archive_bad_name",
            repr(raw),
            f"Archive entry {raw!r} has control characters in its name.",
            "Rename the file to plain printable characters.",
        )
    s = raw.replace("\\", "/")  # Windows zips; treat as a separator so "..\\x" is caught.
    if s.startswith("/") or _DRIVE.match(s):
        return (), error(
            "archive_absolute_path",
            raw,
            f"Archive entry {raw} has an absolute path.",
            "Create the archive with relative paths (e.g. `cd parent && zip -r adapter.zip my-adapter`).",
        )
    parts = tuple(p for p in s.split("/") if p not in ("", "."))
    if ".." in parts:
        return (), error(
            "archive_path_traversal",
            raw,
            f"Archive entry {raw} climbs out of the archive with '..'.",
            "Create the archive with relative paths that stay inside the adapter folder.",
        )
    return parts, None


def _opener_for(
    raw_open: Callable[[], IO[bytes]], name: str, declared: int, budget: _Budget
) -> Callable[[], BinaryIO]:
    def opener() -> BinaryIO:
        try:
            raw = raw_open()
        except _READ_ERRORS + (NotImplementedError, RuntimeError) as exc:
            raise UploadRejected([_corrupt(name, exc)]) from exc
        return io.BufferedReader(_CountingReader(raw, name, declared, budget))  # type: ignore[return-value]

    return opener


def _tar_open(tf: tarfile.TarFile, ti: tarfile.TarInfo) -> BinaryIO:
    f = tf.extractfile(ti)
    if f is None:  # only for non-regular members, which never get here
        raise RuntimeError(f"tar member {ti.name} has no data")
    return f  # type: ignore[return-value]


_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"


def zip_declared_entries(path: Path) -> int | None:
    """The entry count a zip declares in its end-of-central-directory record (ZIP64 included), or None when no
    record is found (``zipfile`` then reports the corruption).

    Reads at most the last 64 KiB + 22 bytes (the record plus the longest comment, APPNOTE.TXT 4.3.16) and, for
    ZIP64, the 56-byte ZIP64 record the locator points at; never the central directory itself.
    """
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        tail_len = min(size, 22 + 0xFFFF)
        f.seek(size - tail_len)
        tail = f.read(tail_len)
        at = tail.rfind(_EOCD)
        if at < 0 or len(tail) - at < 22:
            return None
        count = int.from_bytes(tail[at + 10:at + 12], "little")
        locator = at - 20
        if count == 0xFFFF and locator >= 0 and tail[locator:locator + 4] == _ZIP64_LOCATOR:
            offset = int.from_bytes(tail[locator + 8:locator + 16], "little")
            if offset + 56 <= size:
                f.seek(offset)
                record = f.read(56)
                if record[:4] == _ZIP64_EOCD:
                    count = int.from_bytes(record[32:40], "little")
        return count


def _check_count(count: int, max_members: int) -> None:
    if count > max_members:
        raise UploadRejected(
            [
                error(
                    "archive_too_many_members",
                    None,
                    f"The archive has more than {max_members} entries.",
                    "Upload only the adapter folder (adapter_config.json and adapter_model.safetensors).",
                )
            ]
        )


def _too_large(limit: int, basis: str) -> Problem:
    return error(
        "archive_too_large",
        None,
        f"The archive unpacks to more than {limit} bytes (judged by {basis}).",
        "Upload only the adapter folder; an adapter is normally far smaller than its base model.",
    )


def _corrupt(name: str | None, exc: BaseException) -> Problem:
    logger.info("archive.corrupt", extra={"member": name, "error": type(exc).__name__})
    what = f"Archive entry {name}" if name else "The archive"
    return error(
        "archive_corrupt",
        name,
        f"{what} could not be read ({type(exc).__name__}: {str(exc)[:200]}).",
        "Re-create the archive and upload it again; the upload may have been cut short.",
    )
