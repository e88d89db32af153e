"""File-name rules shared by multipart uploads and archive uploads.

An adapter is one flat PEFT folder: ``adapter_config.json`` plus
``adapter_model.safetensors`` (the only weight file vLLM loads without
unpickling; vllm-project/vllm ``vllm/lora/lora_model.py`` falls back to
``adapter_model.bin``/``.pt`` via ``torch.load``, which Quiver never allows).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from adapters_app.validation.problems import Problem, UploadRejected, error

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

#: Suffixes of pickle-based checkpoints (torch.save / pickle). Never unpickled:
#: loading one runs arbitrary code from the tenant.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})

PICKLE_HINT = (
    "Convert the weights to safetensors: re-save with PEFT `model.save_pretrained(dir, safe_serialization=True)`, "
    "or `safetensors.torch.save_file(torch.load(path, weights_only=True), 'adapter_model.safetensors')` "
    "on your own machine, then upload adapter_model.safetensors."
)

#: Files that archivers and desktops add; skipped silently.
_JUNK_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
_JUNK_DIRS = frozenset({"__MACOSX"})


def is_junk(parts: tuple[str, ...]) -> bool:
    """Whether a relative path (split into parts) is harmless archiver junk.

    Args:
        parts: Path components, e.g. ``("__MACOSX", "a", "._x")``.

    Returns:
        True for ``__MACOSX/…``, ``.DS_Store``, AppleDouble ``._*`` files,
        ``Thumbs.db`` and ``desktop.ini``.
    """
    if not parts:
        return True
    if parts[0] in _JUNK_DIRS:
        return True
    leaf = parts[-1]
    return leaf in _JUNK_NAMES or leaf.startswith("._")


def is_pickle_name(name: str) -> bool:
    """Whether a file name has a pickle checkpoint suffix (case-insensitive)."""
    return PurePosixPath(name).suffix.lower() in PICKLE_SUFFIXES


def pickle_problem(name: str, *, beside_safetensors: bool = False) -> Problem:
    """The rejection for one pickle-format file.

    Args:
        name: the file's relative path.
        beside_safetensors: the upload also has ``adapter_model.safetensors``: then the file is a stray (a leftover
            ``.bin`` checkpoint or padding), and the fix is to remove it, not to convert anything.
    """
    if beside_safetensors:
        return error(
            "pickle_weights",
            name,
            f"{name} is an extra pickle-format file next to adapter_model.safetensors, which already holds the "
            "weights the engine loads; Quiver never opens pickle files, so it refuses uploads that carry one.",
            f"Remove {name} from the upload (or the archive) and upload again; nothing needs converting.",
        )
    return error(
        "pickle_weights",
        name,
        f"{name} is a pickle-based checkpoint; Quiver never unpickles uploaded files because that runs arbitrary code.",
        PICKLE_HINT,
    )


def folder_problems(names: Iterable[str]) -> list[Problem]:
    """Required-file and pickle checks over the file names of one adapter folder.

    Args:
        names: Relative posix paths of the folder's files (no junk). Files in
            sub-folders count for the pickle check only.

    Returns:
        Problems, possibly empty: ``pickle_weights`` per pickle file,
        ``missing_adapter_config``, ``missing_adapter_weights``.
    """
    names = list(names)
    top = {n for n in names if "/" not in n}
    has_weights = WEIGHTS_NAME in top
    problems = [pickle_problem(n, beside_safetensors=has_weights) for n in names if is_pickle_name(n)]
    if CONFIG_NAME not in top:
        problems.append(
            error(
                "missing_adapter_config",
                CONFIG_NAME,
                "The upload has no adapter_config.json.",
                "Upload the folder written by PEFT `save_pretrained`; it contains adapter_config.json.",
            )
        )
    if WEIGHTS_NAME not in top and not any(is_pickle_name(n) for n in top):
        others = sorted(n for n in top if n.endswith(".safetensors"))
        found = f" Found {', '.join(others)}." if others else ""
        problems.append(
            error(
                "missing_adapter_weights",
                WEIGHTS_NAME,
                f"The upload has no adapter_model.safetensors.{found}",
                "Upload the adapter weights as adapter_model.safetensors (one file, as PEFT `save_pretrained` "
                "writes it); sharded or renamed weight files are not loaded by the engine.",
            )
        )
    return problems


def check_upload_names(names: Iterable[str]) -> None:
    """Check the file names of a multipart upload of loose files.

    Args:
        names: The client-supplied file names, one per uploaded file.

    Raises:
        UploadRejected: With every problem found: ``upload_bad_filename``
            (empty, path separators, ``.``/``..``, control characters),
            ``upload_duplicate_name``, ``pickle_weights`` (with a conversion
            hint), ``missing_adapter_config``, ``missing_adapter_weights``.
    """
    problems: list[Problem] = []
    clean: list[str] = []
    seen: set[str] = set()
    for name in names:
        if (
            not isinstance(name, str)
            or name in ("", ".", "..")
            or "/" in name
            or "\\" in name
            or _has_control(name)
        ):
            problems.append(
                error(
                    "upload_bad_filename",
                    name if isinstance(name, str) else None,
                    f"File name {name!r} is not a plain file name.",
                    "Upload the adapter's files by their own names (e.g. adapter_config.json), without folders "
                    "or '..'; to upload a folder, send it as a .zip or .tar.gz archive.",
                )
            )
            continue
        if name in seen:
            problems.append(
                error(
                    "upload_duplicate_name",
                    name,
                    f"File {name} was uploaded twice.",
                    "Send each file once.",
                )
            )
            continue
        seen.add(name)
        if not is_junk((name,)):
            clean.append(name)
    problems.extend(folder_problems(clean))
    if problems:
        raise UploadRejected(problems)


def _has_control(name: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
