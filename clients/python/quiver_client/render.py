"""How the ``quiver`` command shows things: rich tables for people, the API's own JSON with ``--json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Piped or redirected, tables keep every cell whole (rich would cut them to 80 columns); on a terminal, its width.
out = Console(soft_wrap=True, highlight=False, width=None if sys.stdout.isatty() else 1000)
err = Console(stderr=True, soft_wrap=True, highlight=False, width=None if sys.stderr.isatty() else 1000)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (plain ``print``: no markup, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def size(n: Any) -> str:
    """Bytes as ``12.3 MiB``; ``-`` for None."""
    if not isinstance(n, int):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return escape(str(value))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, Callable[[Mapping[str, Any]], Any]]],
          *, empty: str) -> None:
    """A table of ``rows`` with ``(header, getter)`` columns, or the ``empty`` line when there are none."""
    if not rows:
        err.print(empty)
        return
    t = Table(show_edge=False, box=None, pad_edge=False, header_style="bold")
    for header, _ in columns:
        t.add_column(header)
    for row in rows:
        t.add_row(*(_cell(get(row)) for _, get in columns))
    out.print(t)


def problems(report: Mapping[str, Any] | None, *, to_err: bool = False) -> None:
    """A validation report's problems, one per line: severity, code, field, message and its fix."""
    console = err if to_err else out
    for p in (report or {}).get("problems") or []:
        colour = "red" if p.get("severity") == "error" else "yellow"
        where = f" [{escape(str(p['field']))}]" if p.get("field") else ""
        console.print(f"  [{colour}]{p.get('severity')}[/{colour}] {escape(str(p.get('code')))}{where}: "
                      f"{escape(str(p.get('message')))}")
        if p.get("hint"):
            console.print(f"      fix: {escape(str(p['hint']))}")


def version(body: Mapping[str, Any]) -> None:
    """One version: status, sizes, digests, PEFT facts and its report."""
    report = body.get("validation_report") or {}
    out.print(f"[bold]{escape(str(body.get('adapter')))}@{body.get('number')}[/bold]  status "
              f"[bold]{escape(str(body.get('status')))}[/bold]")
    out.print(f"  sha256 {body.get('sha256')}  size {size(body.get('size_bytes'))}")
    out.print(f"  r {_cell(body.get('r'))}  lora_alpha {_cell(body.get('lora_alpha'))}  target_modules "
              f"{_cell(body.get('target_modules'))}")
    out.print(f"  created {body.get('created_at')}  validated {_cell(body.get('validated_at'))}")
    for f in body.get("files") or []:
        out.print(f"  file {escape(str(f.get('name')))}  {size(f.get('size'))}  sha256 {f.get('sha256')}")
    if report:
        out.print(f"  report: {'ok' if report.get('ok') else 'rejected'}, {len(report.get('problems') or [])} "
                  "problem(s)")
        problems(report)
