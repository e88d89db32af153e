"""Build the console (``frontend/``) when its build is missing or older than its sources: ``npm ci``, ``npm run build``.

Used by ``./scripts/demo`` and the browser tests, so a fresh clone serves the console without a manual step. Node 20
and npm come from the machine (Debian packages or nodesource); packages come from the committed lockfile only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

FRONTEND = Path(__file__).resolve().parents[1] / "frontend"
SOURCES = ("src", "index.html", "package.json", "package-lock.json", "vite.config.ts", "tsconfig.app.json", "public")


def _newest(root: Path) -> float:
    mtimes = [0.0]
    for name in SOURCES:
        path = root / name
        if path.is_dir():
            mtimes.extend(p.stat().st_mtime for p in path.rglob("*") if p.is_file())
        elif path.exists():
            mtimes.append(path.stat().st_mtime)
    return max(mtimes)


def ensure_node_modules(root: Path = FRONTEND) -> None:
    """``npm ci`` unless ``node_modules`` was installed from this very lockfile (its sha256 in a stamp file).

    By content, not date: a fresh clone's or a checkout's lockfile is always newer than ``node_modules`` and made
    every run reinstall (a fresh user's finding).

    Raises:
        RuntimeError: npm is not installed, or ``npm ci`` failed (its output is in the message).
    """
    stamp = root / "node_modules" / ".quiver-lock-sha256"
    want = hashlib.sha256((root / "package-lock.json").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want:
        return
    _npm(root, "ci", "--no-audit", "--no-fund")
    stamp.write_text(want + "\n")


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_console_built(root: Path = FRONTEND, *, say: Callable[[str], None] = _to_stderr) -> Path:
    """The built ``dist/`` folder, rebuilt when a source is newer than ``dist/index.html``.

    Args:
        root: the ``frontend/`` folder.
        say: where the one line announcing a build goes (stderr by default; the demo passes its own printer, so
            the line is said once, in the demo's voice; it printed its own beside this one). Nothing is said when
            the build is up to date.

    Raises:
        RuntimeError: npm is missing or the build failed.
    """
    index = root / "dist" / "index.html"
    if index.exists() and index.stat().st_mtime >= _newest(root):
        return index.parent
    say("building the web console (npm ci, vite build; about a minute the first time)...")
    ensure_node_modules(root)
    _npm(root, "run", "build")
    return index.parent


def _npm(root: Path, *args: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed; the console needs Node 20+ and npm (apt-get install nodejs npm).")
    out = subprocess.run([npm, *args], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"npm {' '.join(args)} failed in {root}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
