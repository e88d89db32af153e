"""Bounds on tenant regexes (``target_modules``, ``exclude_modules``, ``rank_pattern``/``alpha_pattern`` keys).

PEFT and vLLM match these with Python's backtracking ``re``; a crafted pattern such as ``(a+)+$`` can hold a worker
for minutes on one module name. Instead of another engine (google-re2 lacks lookarounds that PEFT allows, so a
pattern could mean something else there), patterns are refused when they could backtrack exponentially: longer
than 1,024 characters, a back-reference, a repeat (``*``, ``+``, ``{n,}``) over something that itself repeats or
alternates, or more than four unbounded repeats on one path through the pattern. Subjects are module paths (under 200 characters), so what remains runs in polynomial time.
Pure; no Django.
"""

from __future__ import annotations

import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from typing import Any

# Real configs carry long ones: Unsloth writes a 333-character target_modules alternation.
MAX_PATTERN_CHARS = 1024
MAX_PATTERNS = 256
# Each unbounded repeat on one path through the pattern multiplies the backtracking over a module path of n
# characters by up to n; module paths come from the base model (n under ~60), so four keep a failing match near
# n**4 / 24, about 5 * 10**5 steps. Unsloth's pattern has four ``.*?`` in one alternative.
MAX_UNBOUNDED_REPEATS = 4
_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, getattr(sre_constants, "POSSESSIVE_REPEAT", None)}
_BACKREFS = {sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS}


def _children(op: Any, av: Any) -> list[Any]:
    """Sub-patterns of one parsed node."""
    if op in _REPEATS:
        return [av[2]]
    if op == sre_constants.SUBPATTERN:
        return [av[3]]
    if op == sre_constants.BRANCH:
        return list(av[1])
    if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return [av[1]]
    if op == getattr(sre_constants, "ATOMIC_GROUP", None):
        return [av]
    return []


def _varies(sub: Any) -> bool:
    """Whether a sub-pattern contains a repeat or an alternation (ambiguity for an outer repeat)."""
    for op, av in sub:
        if op in _REPEATS or op == sre_constants.BRANCH:
            return True
        if any(_varies(child) for child in _children(op, av)):
            return True
    return False


def _unbounded(sub: Any) -> int:
    """Most unbounded repeats on any one path through ``sub`` (alternatives: the max; a sequence: the sum)."""
    count = 0
    for op, av in sub:
        if op in _REPEATS and av[1] > 16:
            count += 1
        children = [_unbounded(child) for child in _children(op, av)]
        count += max(children) if op == sre_constants.BRANCH and children else sum(children)
    return count


def _walk(sub: Any) -> str | None:
    for op, av in sub:
        if op in _BACKREFS:
            return "uses a back-reference"
        if op in _REPEATS and av[1] > 1 and _varies(av[2]):
            return "repeats a group that itself repeats or alternates (exponential backtracking)"
        for child in _children(op, av):
            problem = _walk(child)
            if problem:
                return problem
    return None


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused, or None when it is a valid, bounded regex.

    Returns:
        A phrase to follow the field name, e.g. ``"is not a valid regex (...)"``.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}"
    try:
        parsed = sre_parse.parse(pattern)
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"is not a valid regex ({exc})"
    problem = _walk(parsed)
    if problem is None and _unbounded(parsed) > MAX_UNBOUNDED_REPEATS:
        problem = f"has more than {MAX_UNBOUNDED_REPEATS} unbounded repeats (*, +, {{n,}})"
    return problem
