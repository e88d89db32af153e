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


NATIVE_CLOCK = re.compile(r"""type=["'](?:datetime-local|time)["']""")


def test_no_form_asks_for_a_time_with_the_browsers_clock_picker() -> None:
    """The browser's datetime-local and time pickers follow the locale's clock: the key expiry read "05:30 PM" in
    en-US. Times are typed on a 24-hour clock instead (``src/components/expiry.ts``)."""
    offenders = [f"{path.relative_to(FRONTEND)}:{n}" for path in sorted((FRONTEND / "src").rglob("*.tsx"))
                 if "__tests__" not in path.parts
                 for n, line in enumerate(path.read_text().splitlines(), 1) if NATIVE_CLOCK.search(line)]
    assert offenders == [], f"ask for HH:MM on a 24-hour clock (src/components/expiry.ts): {offenders}"
