"""The validation report stored on an adapter version and returned by the API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters_app.validation.problems import ERROR, Problem

REPORT_SCHEMA = 1


@dataclass
class ValidationReport:
    """Every problem found in one adapter, plus the facts the UI shows.

    Attributes:
        problems: Errors and warnings, in the order checks ran.
        facts: What was learned, e.g. ``r``, ``lora_alpha``, ``use_rslora``,
            ``scaling``, ``target_modules`` (resolved module names),
            ``tensor_count``, ``weights_bytes``, ``base_model_decision``.
    """

    problems: list[Problem] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no problem has severity "error"."""
        return not any(p.severity == ERROR for p in self.problems)

    @property
    def codes(self) -> list[str]:
        """Problem codes in order (handy for tests and logs)."""
        return [p.code for p in self.problems]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"schema": 1, "ok", "problems": [...], "facts": {...}}``."""
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "problems": [p.to_dict() for p in self.problems],
            "facts": self.facts,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ValidationReport:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: If ``schema`` is not a version this code reads.
        """
        if d.get("schema") != REPORT_SCHEMA:
            raise ValueError(f"report schema {d.get('schema')!r} is not supported (expected {REPORT_SCHEMA})")
        return cls(
            problems=[Problem.from_dict(p) for p in d.get("problems", [])], facts=dict(d.get("facts", {}))
        )
