"""iter_archive / extract_archive: hostile archives are refused before any byte is yielded."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from adapters_app.validation import UploadRejected, extract_archive, iter_archive

GOOD = {
    "adapter_config.json": b'{"peft_type": "LORA"}',
    "adapter_model.safetensors": b"\x08" + b"\x00" * 7 + b"{}      ",
}
CAPS = {"max_members": 50, "max_total_bytes": 1 << 20}


def _zip(path: Path, files: dict[str, bytes], *, method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def _read_all(path: Path, **caps: int) -> dict[str, bytes]:
    out = {}
    for m in iter_archive(path, **(caps or CAPS)):
        with m.open() as f:
            out[m.name] = f.read()
        assert m.size == len(out[m.name])
    return out


def _codes(path: Path, **caps: int) -> list[str]:
    with pytest.raises(UploadRejected) as info:
        _read_all(path, **caps)
    return info.value.codes


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_tar_flavours_detected_by_content(tmp_path: Path, mode: str) -> None:
    path = _tar(tmp_path / "upload.bin", {f"my-adapter/{k}": v for k, v in GOOD.items()}, mode)
    assert _read_all(path) == GOOD


def test_zip_top_folder_stripped_and_junk_skipped(tmp_path: Path) -> None:
    files = {f"my-adapter/{k}": v for k, v in GOOD.items()}
    files["__MACOSX/my-adapter/._adapter_config.json"] = b"junk"
    files["my-adapter/.DS_Store"] = b"junk"
    files["my-adapter/README.md"] = b"hi"
    got = _read_all(_zip(tmp_path / "a.zip", files))
    assert got == {**GOOD, "README.md": b"hi"}


def test_files_at_top_level_kept(tmp_path: Path) -> None:
    assert _read_all(_zip(tmp_path / "a.zip", GOOD, method=zipfile.ZIP_STORED)) == GOOD


def test_extract_archive_writes_files(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    names = extract_archive(_zip(tmp_path / "a.zip", GOOD), dest, **CAPS)
    assert sorted(names) == sorted(GOOD)
    assert (dest / "adapter_config.json").read_bytes() == GOOD["adapter_config.json"]


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("../evil", "archive_path_traversal"),
        ("a/../../evil", "archive_path_traversal"),
        ("..\\evil", "archive_path_traversal"),
        ("/etc/passwd", "archive_absolute_path"),
        ("C:/x", "archive_absolute_path"),
        ("bad\x01name", "archive_bad_name"),
    ],
)
def test_unsafe_names_rejected(tmp_path: Path, name: str, code: str) -> None:
    assert _codes(_tar(tmp_path / "a.tar", {**GOOD, name: b"x"}, "w")) == [code]


@pytest.mark.parametrize("linktype", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_links_rejected(tmp_path: Path, linktype: bytes) -> None:
    path = _tar(tmp_path / "a.tgz", GOOD)
    with tarfile.open(tmp_path / "l.tgz", "w:gz") as tf:
        with tarfile.open(path) as src:
            for m in src:
                tf.addfile(m, src.extractfile(m))
        link = tarfile.TarInfo("extra")
        link.type = linktype
        link.linkname = "/etc/passwd"
        tf.addfile(link)
    assert _codes(tmp_path / "l.tgz") == ["archive_link"]


def test_zip_symlink_rejected(tmp_path: Path) -> None:
    path = _zip(tmp_path / "a.zip", GOOD)
    with zipfile.ZipFile(path, "a") as zf:
        info = zipfile.ZipInfo("link")
        info.create_system = 3
        info.external_attr = (0o120777) << 16
        zf.writestr(info, "/etc/passwd")
    assert _codes(path) == ["archive_link"]


def test_device_rejected(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "d.tar", "w") as tf:
        for name, data in GOOD.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        dev = tarfile.TarInfo("null")
        dev.type = tarfile.CHRTYPE
        tf.addfile(dev)
    assert _codes(tmp_path / "d.tar") == ["archive_special_file"]


def test_member_count_cap(tmp_path: Path) -> None:
    files = {**GOOD, **{f"f{i}.txt": b"" for i in range(10)}}
    assert _codes(_zip(tmp_path / "a.zip", files), max_members=5, max_total_bytes=1 << 20) == [
        "archive_too_many_members"
    ]


def test_declared_size_cap(tmp_path: Path) -> None:
    files = {**GOOD, "big.txt": b"\x00" * 100_000}
    for path in (_zip(tmp_path / "a.zip", files), _tar(tmp_path / "a.tgz", files)):
        assert _codes(path, max_members=50, max_total_bytes=50_000) == ["archive_too_large"]


def test_zip_bomb_lying_header_caught_while_streaming(tmp_path: Path) -> None:
    """A zip whose central directory under-declares a member's size: real bytes are counted."""
    path = _zip(tmp_path / "bomb.zip", {**GOOD, "payload.txt": b"\x00" * 200_000})
    raw = bytearray(path.read_bytes())
    # Patch the declared uncompressed size of payload.txt in both headers to 10 bytes.
    real = (200_000).to_bytes(4, "little")
    assert raw.count(real) == 2
    raw = raw.replace(real, (10).to_bytes(4, "little"))
    path.write_bytes(bytes(raw))
    with pytest.raises(UploadRejected) as info:
        _read_all(path, max_members=50, max_total_bytes=1000)
    assert info.value.codes[0] in {"archive_size_mismatch", "archive_corrupt", "archive_too_large"}


def test_stream_budget_counts_real_bytes(tmp_path: Path) -> None:
    path = _zip(tmp_path / "a.zip", {**GOOD, "x.txt": b"a" * 3000})
    members = iter_archive(path, max_members=50, max_total_bytes=4000)
    with pytest.raises(UploadRejected) as info:
        for m in members:
            m.open().read()
            # Read twice: the budget counts every byte streamed, not just headers.
            m.open().read()
    assert info.value.codes == ["archive_too_large"]


@pytest.mark.parametrize(
    ("files", "code"),
    [
        ({f"a/{k}": v for k, v in GOOD.items()} | {"b/x.txt": b"x"}, "archive_multiple_folders"),
        (GOOD | {f"ckpt-1/{k}": v for k, v in GOOD.items()}, "archive_multiple_adapters"),
        ({}, "archive_empty"),
        ({"adapter_config.json": b"{}", "adapter_model.bin": b"x"}, "pickle_weights"),
        ({"adapter_model.safetensors": b"x"}, "missing_adapter_config"),
    ],
)
def test_structure_rules(tmp_path: Path, files: dict[str, bytes], code: str) -> None:
    assert _codes(_zip(tmp_path / "a.zip", files)) == [code]


def test_duplicate_member_rejected(tmp_path: Path) -> None:
    path = _tar(tmp_path / "a.tar", GOOD, "w")
    with tarfile.open(path, "a") as tf:
        ti = tarfile.TarInfo("adapter_config.json")
        ti.size = 2
        tf.addfile(ti, io.BytesIO(b"{}"))
    assert _codes(path) == ["archive_duplicate_name"]


@pytest.mark.parametrize("content", [b"", b"hello world" * 100, b"\x1f\x8b\x08garbage-gzip"])
def test_unknown_or_corrupt_format(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.zip"
    path.write_bytes(content)
    assert _codes(path)[0] in {"archive_unknown_format", "archive_corrupt"}


def test_truncated_zip_is_corrupt(tmp_path: Path) -> None:
    path = _zip(tmp_path / "a.zip", GOOD)
    path.write_bytes(path.read_bytes()[:40])
    assert _codes(path) == ["archive_corrupt"]


def test_encrypted_zip_member_rejected(tmp_path: Path) -> None:
    path = _zip(tmp_path / "a.zip", GOOD)
    raw = bytearray(path.read_bytes())
    # Set the "encrypted" general-purpose flag bit in the central directory entries.
    i = raw.find(b"PK\x01\x02")
    while i != -1:
        raw[i + 8] |= 0x01
        i = raw.find(b"PK\x01\x02", i + 4)
    path.write_bytes(bytes(raw))
    assert set(_codes(path)) == {"archive_encrypted"}


def test_zip_with_padding_bin_names_the_stray_file(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("adapter_config.json", "{}")
        zf.writestr("adapter_model.safetensors", b"x")
        zf.writestr("padding.bin", b"\0" * 64)
    with pytest.raises(UploadRejected) as info:
        list(iter_archive(path, max_members=64, max_total_bytes=1 << 20))
    (problem,) = info.value.problems
    assert problem.field == "padding.bin" and "Remove padding.bin" in problem.hint


def test_zip_entry_count_is_read_from_the_end_record_before_parsing(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from adapters_app.validation.archive import zip_declared_entries

    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(70):
            zf.writestr(f"f{i}.txt", b"")
    assert zip_declared_entries(path) == 70

    def never(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the central directory was parsed")

    monkeypatch.setattr(zipfile, "ZipFile", never)
    with pytest.raises(UploadRejected) as info:
        list(iter_archive(path, max_members=64, max_total_bytes=1 << 20))
    assert info.value.problems[0].code == "archive_too_many_members"

