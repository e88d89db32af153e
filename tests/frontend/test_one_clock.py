"""Every instant the console shows goes through ``frontend/src/format.ts`` (a 24-hour clock, docs/console.md): a
direct ``toLocaleString``/``toLocaleTimeString`` renders "5:14:57 AM" in en-US (a fresh user found two on the adapter
page's serving panel)."""

from __future__ import annotations

import re

from devtools.frontend import FRONTEND

DIRECT = re.compile(r"\.toLocale(?:Date|Time)?String\(")


def test_no_component_formats_an_instant_itself() -> None:
    offenders = [f"{path.relative_to(FRONTEND)}:{n}" for path in sorted((FRONTEND / "src").rglob("*.ts*"))
                 if path.name != "format.ts" and "__tests__" not in path.parts
                 for n, line in enumerate(path.read_text().splitlines(), 1) if DIRECT.search(line)]
    assert offenders == [], f"use formatDateTime/formatTime from src/format.ts: {offenders}"
