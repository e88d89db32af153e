"""The import contracts in pyproject.toml ([tool.importlinter]) hold: apps are layered with no cycles, the pure
decisions (inference.policy) and the node agent (inference.node) import no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_routed_and_scheduled_task_is_registered(settings) -> None:  # type: ignore[no-untyped-def]
    from workers.celery_app import app

    app.loader.import_default_modules()
    named = {v["task"] for v in settings.CELERY_BEAT_SCHEDULE.values()} | set(settings.CELERY_TASK_ROUTES)
    assert named and not named - set(app.tasks), named - set(app.tasks)
