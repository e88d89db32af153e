"""`platform/` must never shadow the stdlib `platform` module (conventions.md, "Layout").

The check runs in a *subprocess* with the repo root first on sys.path, as `manage.py`, `python -m` and `celery -A`
do. In-process it would prove nothing: pytest imports the stdlib `platform` before the root reaches sys.path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# `import uuid` is what Django runs at start-up; it calls platform.system() at import time.
PROBE = "import sys; sys.path.insert(0, {root!r}); import uuid, platform; assert platform.system(); print(platform.__file__)"


def _probe(root: Path) -> subprocess.CompletedProcess[str]:
    # -I: isolated mode, so PYTHONPATH/user site cannot mask or cause the problem; cwd = root like manage.py.
    return subprocess.run([sys.executable, "-I", "-c", PROBE.format(root=str(root))], cwd=root,
                          capture_output=True, text=True, timeout=60, check=False)


def test_platform_dir_is_not_a_package() -> None:
    assert (REPO_ROOT / "platform").is_dir()
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()


def test_stdlib_platform_wins_from_the_repo_root() -> None:
    done = _probe(REPO_ROOT)
    assert done.returncode == 0, done.stderr
    # The module that answered is the stdlib one, not anything under the repo.
    assert not Path(done.stdout.strip()).is_relative_to(REPO_ROOT)


def test_negative_control_a_platform_package_breaks_import_uuid(tmp_path: Path) -> None:
    """Prove the probe can fail: a copy of platform/ plus an __init__.py makes `import uuid` crash."""
    shutil.copytree(REPO_ROOT / "platform", tmp_path / "platform")
    (tmp_path / "platform" / "__init__.py").write_text("", encoding="utf-8")
    done = _probe(tmp_path)
    assert done.returncode != 0
    assert "platform" in done.stderr and "has no attribute" in done.stderr, done.stderr
