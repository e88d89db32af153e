"""Local validation before any byte moves: the server's own validator, imported, never copied.

The validator is the pure library ``adapters_app.validation`` of the server distribution (no Django, no network:
stdlib and numpy). The client imports it where it is installed beside the client: the repository's ``.venv`` has
both (``scripts/setup-venv``); elsewhere install the server package next to the client (``pip install --no-deps
<repo>`` plus ``numpy``). So a push is refused with the very codes, messages and hints the server's worker would
give. Without the validator a push says so and stops, unless ``--no-local-check`` lets the server do all the checks.

Two stages, so an obviously bad folder costs no request at all:

1. :func:`check_names` (offline): the folder holds ``adapter_config.json`` and ``adapter_model.safetensors``, no
   pickle checkpoint in their place (``folder_problems``, the rule every upload path applies);
2. :func:`check_adapter`: ``validate_adapter_dir`` against the target base model's facts and its pool's limits, as
   ``GET /api/v1/base-models`` gives them (the worker calls the same function with the same inputs). A server that
   does not publish ``facts`` gets the base-independent part: ``parse_config``.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from quiver_client.errors import QuiverError, ValidationFailed

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
SERVED_FILES = (CONFIG_NAME, WEIGHTS_NAME)
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
MAX_ARCHIVE_MEMBERS = 64
MAX_CONFIG_BYTES = 1 << 20


def validator() -> ModuleType:
    """The server's validator package, ``adapters_app.validation``.

    Raises:
        QuiverError: ``validator_missing`` when it is not installed beside the client (the message gives both fixes).
    """
    try:
        return importlib.import_module("adapters_app.validation")
    except ImportError as exc:
        raise QuiverError("Local validation needs Quiver's validator (adapters_app.validation), which is not installed "
                          "here: install the server package beside the client (`pip install --no-deps <quiver repo> "
                          "numpy`), or pass --no-local-check to leave every check to the server.",
                          code="validator_missing") from exc


def _report(problems: Sequence[Any], facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    items = [p.to_dict() for p in problems]
    return {"schema": 1, "ok": not any(p["severity"] == "error" for p in items), "problems": items,
            "facts": dict(facts or {})}


def _raise_if_errors(report: dict[str, Any]) -> dict[str, Any]:
    if not report["ok"]:
        errors = [p for p in report["problems"] if p["severity"] == "error"]
        first = errors[0]
        more = f" (and {len(errors) - 1} more error(s), listed above)" if len(errors) > 1 else ""
        raise ValidationFailed(f"Local validation failed, nothing was uploaded: {first['code']}: {first['message']} "
                               f"Fix: {first['hint']}{more}", report=report, where="local")
    return report


def folder_names(folder: Path) -> list[str]:
    """Top-level file names of an adapter folder, without archiver junk (``.DS_Store``, ``._*``)."""
    is_junk = validator().intake.is_junk
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not is_junk((p.name,)))


def check_names(folder: Path) -> list[str]:
    """Stage 1, offline: the files a push would send, after the server's required-file and pickle rules.

    Other files in the folder (README.md, a Trainer's ``optimizer.pt``…) are left behind, not sent: only the two
    files the engine reads are stored. A pickle checkpoint counts only when it stands in for the safetensors file.

    Returns:
        ``["adapter_config.json", "adapter_model.safetensors"]``.

    Raises:
        ValidationFailed: ``missing_adapter_config``, ``missing_adapter_weights``, ``pickle_weights`` (with the
            server's conversion hint).
        QuiverError: ``validator_missing``.
    """
    names = folder_names(folder)
    if all(n in names for n in SERVED_FILES):
        return list(SERVED_FILES)
    problems = validator().intake.folder_problems(names)
    if WEIGHTS_NAME in names:  # pickle files beside the safetensors are not sent: not a problem of this push
        problems = [p for p in problems if p.code != "pickle_weights"]
    _raise_if_errors(_report(problems))
    raise AssertionError("folder_problems found no missing file")  # pragma: no cover


@contextmanager
def served_view(folder: Path) -> Iterator[Path]:
    """A temporary folder holding links to exactly the files a push sends, for the validator to read."""
    with tempfile.TemporaryDirectory(prefix="quiver-check-") as tmp:
        view = Path(tmp)
        for name in SERVED_FILES:
            (view / name).symlink_to((folder / name).resolve())
        yield view


def check_adapter(folder: Path, *, base: Mapping[str, Any]) -> dict[str, Any]:
    """Stage 2: ``validate_adapter_dir`` on the files a push sends, against one entry of ``GET /api/v1/base-models``.

    Args:
        folder: The adapter folder (stage 1 passed).
        base: ``{"base_model_name", "max_lora_rank", "max_adapter_bytes", "facts"?}``.

    Returns:
        The report (``{"schema", "ok", "problems", "facts"}``, the server's shape), when it has no error.

    Raises:
        ValidationFailed: the report has errors (every problem is in ``err.report``).
        QuiverError: ``validator_missing``.
    """
    v = validator()
    facts = base.get("facts")
    if not isinstance(facts, Mapping) or not facts:
        # An older server publishes no facts: run the base-independent part of the same validator.
        data = (folder / CONFIG_NAME).read_bytes()[: MAX_CONFIG_BYTES + 1]
        _, problems, config_facts = v.parse_config(data)
        return _raise_if_errors(_report(problems, {**config_facts, "checked": "config only (server publishes no "
                                                                               "base-model facts)"}))
    limits = v.PoolLimits(max_lora_rank=int(base["max_lora_rank"]), max_adapter_bytes=int(base["max_adapter_bytes"]))
    with served_view(folder) as view:
        report = v.validate_adapter_dir(view, base=v.BaseModelFacts.from_dict(facts), limits=limits).to_dict()
    return _raise_if_errors(report)


@contextmanager
def unpacked(archive: Path) -> Iterator[Path]:
    """Unpack an adapter archive (.zip, .tar.gz…) with the server's safe reader into a temporary folder.

    Raises:
        ValidationFailed: the archive breaks an intake rule (``archive_*``, ``pickle_weights``…), as on the server.
        QuiverError: ``validator_missing``.
    """
    v = validator()
    with tempfile.TemporaryDirectory(prefix="quiver-unpack-") as tmp:
        try:
            v.extract_archive(archive, Path(tmp), max_members=MAX_ARCHIVE_MEMBERS,
                              max_total_bytes=archive.stat().st_size * 64 + (1 << 30))
        except v.UploadRejected as exc:
            _raise_if_errors(_report(exc.problems))
        yield Path(tmp)
