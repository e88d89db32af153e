"""A problem list that caps repeats of one code, so a hostile file can't flood a report."""

from __future__ import annotations

from collections import Counter

from adapters_app.validation.problems import Problem

MAX_PER_CODE = 20


class ProblemCollector:
    """Collects problems, keeping at most ``max_per_code`` per code plus one summary.

    Args:
        max_per_code: Individual problems kept per code; later ones are
            counted and summarised by :meth:`finish` ("… and N more").
    """

    def __init__(self, max_per_code: int = MAX_PER_CODE) -> None:
        self.max_per_code = max_per_code
        self._kept: list[Problem] = []
        self._counts: Counter[str] = Counter()
        self._first: dict[str, Problem] = {}

    def add(self, problem: Problem) -> None:
        """Record one problem (kept if under the cap for its code)."""
        self._counts[problem.code] += 1
        self._first.setdefault(problem.code, problem)
        if self._counts[problem.code] <= self.max_per_code:
            self._kept.append(problem)

    def extend(self, problems: list[Problem]) -> None:
        """Record several problems."""
        for p in problems:
            self.add(p)

    def count(self, code: str) -> int:
        """How many problems with ``code`` were recorded (including dropped ones)."""
        return self._counts[code]

    def finish(self) -> list[Problem]:
        """The kept problems, plus one summary per code that hit the cap."""
        out = list(self._kept)
        for code, n in self._counts.items():
            if n > self.max_per_code:
                first = self._first[code]
                out.append(
                    Problem(
                        code=code,
                        severity=first.severity,
                        field=None,
                        message=f"... and {n - self.max_per_code} more problems of this kind ({n} in all).",
                        hint=first.hint,
                    )
                )
        return out
