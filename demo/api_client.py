"""The tenant side of the upload API, as the demo and the end-to-end tests use it (plain httpx, bearer key)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def upload_adapter(api: httpx.Client, name: str, folder: Path, *, base_model: str) -> dict[str, Any]:
    """``POST /api/v1/adapters/{name}/versions`` with the folder's two PEFT files as multipart ``files``.

    Returns:
        The version JSON (``number``, ``status``, ``sha256``...).

    Raises:
        httpx.HTTPStatusError: the API refused the upload (its body says why).
    """
    with ExitStack() as stack:
        files = [("files", (n, stack.enter_context((folder / n).open("rb")))) for n in ADAPTER_FILES]
        resp = api.post(f"/api/v1/adapters/{name}/versions", files=files, data={"base_model": base_model})
    resp.raise_for_status()
    return resp.json()


def wait_validated(api: httpx.Client, name: str, number: int, *, timeout: float = 180, poll: float = 0.3
                   ) -> dict[str, Any]:
    """Poll a version until validation ends (``ready`` or ``rejected``); returns its JSON.

    Raises:
        TimeoutError: still ``uploaded``/``validating`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = api.get(f"/api/v1/adapters/{name}/versions/{number}").json()
        if body["status"] in ("ready", "rejected"):
            return body
        time.sleep(poll)
    raise TimeoutError(f"adapter {name} v{number} was not validated within {timeout:.0f} s")
