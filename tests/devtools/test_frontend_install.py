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


def test_a_build_is_announced_once_through_the_callers_printer_and_an_up_to_date_one_not_at_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo printed "building the web console" twice: its own line, then this function's."""
    def fake_npm(root: Path, *args: str) -> None:
        if args == ("run", "build"):
            (root / "dist").mkdir(exist_ok=True)
            (root / "dist" / "index.html").write_text("<html></html>")

    monkeypatch.setattr(frontend, "_npm", fake_npm)
    monkeypatch.setattr(frontend, "ensure_node_modules", lambda root: None)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.tsx").write_text("// source")
    said: list[str] = []
    assert frontend.ensure_console_built(tmp_path, say=said.append) == tmp_path / "dist"
    assert said == ["building the web console (npm ci, vite build; about a minute the first time)..."]
    assert capsys.readouterr().err == ""  # only through `say`
    frontend.ensure_console_built(tmp_path, say=said.append)  # up to date: no word
    assert len(said) == 1

