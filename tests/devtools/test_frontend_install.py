"""``devtools.frontend.ensure_node_modules`` reinstalls by the lockfile's content, not its date: a fresh clone's
lockfile is always newer than an installed tree, and reinstalling then emptied a shared ``node_modules``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools import frontend


def test_npm_ci_runs_once_per_lockfile_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []

    def fake_npm(root: Path, *args: str) -> None:
        calls.append(args)
        (root / "node_modules").mkdir(exist_ok=True)

    monkeypatch.setattr(frontend, "_npm", fake_npm)
    lock = tmp_path / "package-lock.json"
    lock.write_text('{"lockfileVersion": 3}')
    frontend.ensure_node_modules(tmp_path)
    assert calls == [("ci", "--no-audit", "--no-fund")]

    future = lock.stat().st_mtime + 3600
    os.utime(lock, (future, future))  # a checkout or a clone: newer, same content
    frontend.ensure_node_modules(tmp_path)
    assert len(calls) == 1

    lock.write_text('{"lockfileVersion": 3, "packages": {}}')
    frontend.ensure_node_modules(tmp_path)
    assert len(calls) == 2
