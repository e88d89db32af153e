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
# Bounded repeats backtrack too: ``.{0,16}`` eight times in a row passed the check above and took 0.36 s per module
# path (x4.7 per extra one; a hostile upload held a validation worker for its whole time limit). So every variable
# repeat on a path counts, by its choices (max - min + 1, at most SUBJECT_CHARS), and their product on any one path
# may not pass what four unbounded repeats cost.
SUBJECT_CHARS = 60
MAX_BACKTRACK = SUBJECT_CHARS ** MAX_UNBOUNDED_REPEATS
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


def _backtrack(sub: Any) -> int:
    """Upper estimate of the ways a match of ``sub`` can split a subject: per path (alternatives: the max), the product
    of each variable repeat's choices times its body's; a fixed count (``{3}``) adds none."""
    total = 1
    for op, av in sub:
        if op in _REPEATS:
            choices = min(av[1] - av[0] + 1, SUBJECT_CHARS) if av[1] != av[0] else 1
            total *= choices * _backtrack(av[2])
        elif op == sre_constants.BRANCH:
            total *= max((_backtrack(child) for child in av[1]), default=1)
        else:
            for child in _children(op, av):
                total *= _backtrack(child)
        total = min(total, MAX_BACKTRACK + 1)  # only "over the budget" matters; keeps the product small
    return total


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
    if problem is None and _backtrack(parsed) > MAX_BACKTRACK:
        problem = (f"has too many variable repeats in a row (each of *, +, ?, {{m,n}} multiplies the backtracking; "
                   f"at most {MAX_UNBOUNDED_REPEATS} unbounded ones' worth): list the module names instead")
    return problem
