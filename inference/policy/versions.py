"""Which version of an adapter a request reaches: the serving rule's weighted choice, sticky per caller.

A serving rule is a list of ``(version number, weight)`` pairs whose weights sum to 100 (one pair at 100 = a plain
promotion; ``[(3, 90), (4, 10)]`` = a 10 % canary of v4). The gateway calls :func:`choose_version` once per request
(``inference.gateway.snapshot.RuleView.pick``); the control plane validates rules with :func:`rule_check`.

Sticky assignment follows the hash bucketing of feature-flag systems (Unleash's gradual rollout:
``normalized_hash(identifier, activation_group)`` = murmur3 of ``"<group>:<user id>"`` mod 100,
Unleash/unleash-client-python ``UnleashClient/utils.py``; here SHA-256, from the standard library): a caller's
OpenAI ``user`` field and the adapter hash to a fixed point in [0, 1), so the same user always lands in the same
version while the rule stands, and moving the split from 10 to 20 % keeps the first 10 %'s users on the canary.
Without ``user`` the caller's uniform ``draw`` decides. Pure: no clock, randomness or I/O inside.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

WEIGHT_TOTAL = 100
MAX_VERSIONS_IN_RULE = 4


class RuleInvalid(ValueError):
    """A serving rule that cannot stand; the message names the fix, ``field`` the input it is about (or None)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def sticky_point(salt: str, user: str) -> float:
    """The fixed point in [0, 1) that ``user`` occupies for ``salt`` (the adapter): SHA-256's first 8 bytes."""
    digest = hashlib.sha256(f"{salt}\x00{user}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def choose_version(weights: Sequence[int], *, salt: str, user: str | None, draw: float) -> int:
    """The index into ``weights`` that one request goes to.

    Args:
        weights: each choice's weight (non-negative; at least one positive), in the rule's order.
        salt: what makes stickiness per adapter (two adapters split the same user independently).
        user: OpenAI's ``user`` field; when a non-empty string, the choice is a pure function of ``(salt, user)``.
        draw: a uniform number in [0, 1) from the caller, used only without ``user``.

    Returns:
        An index ``i`` with ``weights[i] > 0``; a choice's share of users (or of draws) is its weight's share.

    Raises:
        ValueError: no positive weight.
    """
    total = sum(w for w in weights if w > 0)
    if total <= 0:
        raise ValueError("a serving rule needs at least one positive weight")
    if len(weights) == 1:
        return 0
    point = sticky_point(salt, user) if user else min(max(draw, 0.0), 1.0 - 1e-12)
    mark = point * total
    running = 0
    last = 0
    for index, weight in enumerate(weights):
        if weight <= 0:
            continue
        running += weight
        last = index
        if mark < running:
            return index
    return last


def rule_check(rule: Sequence[tuple[int, int]], *, ready: set[int] | frozenset[int]) -> list[tuple[int, int]]:
    """A serving rule made canonical (heaviest first, zero weights dropped), or why it cannot stand.

    Args:
        rule: ``(version number, weight)`` pairs; weights are whole percentages.
        ready: the adapter's version numbers that are ``ready`` (a rule may name no other).

    Raises:
        RuleInvalid: empty, a repeated or non-ready version, a weight outside 0..100, weights not summing to 100,
            or more than :data:`MAX_VERSIONS_IN_RULE` versions.
    """
    pairs = [(int(v), int(w)) for v, w in rule]
    if not pairs:
        raise RuleInvalid("A serving rule names at least one version.")
    numbers = [v for v, _ in pairs]
    if len(set(numbers)) != len(numbers):
        raise RuleInvalid("Each version appears once in a serving rule.")
    for number, weight in pairs:
        if not 0 <= weight <= WEIGHT_TOTAL:
            raise RuleInvalid(f"Weight {weight} for version {number} is outside 0..{WEIGHT_TOTAL}.")
        if number not in ready:
            raise RuleInvalid(f"Version {number} is not ready; only ready versions can take traffic.")
    if sum(w for _, w in pairs) != WEIGHT_TOTAL:
        raise RuleInvalid(f"Weights must sum to {WEIGHT_TOTAL} (got {sum(w for _, w in pairs)}).")
    kept = [(v, w) for v, w in pairs if w > 0]
    if len(kept) > MAX_VERSIONS_IN_RULE:
        raise RuleInvalid(f"At most {MAX_VERSIONS_IN_RULE} versions may share traffic.")
    return sorted(kept, key=lambda p: (-p[1], p[0]))


def canary_rule(current: Sequence[tuple[int, int]], *, version: int, percent: int) -> list[tuple[int, int]]:
    """The rule that sends ``percent`` % to ``version`` and the rest to the current rule's heaviest version.

    ``percent`` 0 drops the canary (the primary alone); 100 is a promotion. The primary is the current rule's
    heaviest version other than ``version``; with no rule at all it is a promotion (which ``rule_check`` then judges).
    A canary gives a small share to a version that is not the primary, so two calls are refused rather than
    carried out: a canary of the version that serves alone (before, a 200 that changed nothing), and a canary of
    the version heavier than every other (before, ``[(1, 90), (2, 10)]`` + canary v1 10 % swapped the split and
    moved 80 % of the traffic). Both stay possible at 100 % (a promotion).

    Raises:
        RuleInvalid: ``percent`` outside 0..100; ``version`` serves alone or is the heaviest version of ``current``
            (``field`` ``"version"``; the message names promote or another version as the fix).
    """
    if not 0 <= percent <= WEIGHT_TOTAL:
        raise RuleInvalid(f"A canary takes 0..{WEIGHT_TOTAL} percent (got {percent}).", field="percent")
    others = sorted((p for p in current if p[0] != version), key=lambda p: (-p[1], p[0]))
    if percent == WEIGHT_TOTAL or not current:
        return [(version, WEIGHT_TOTAL)]
    if not others:
        raise RuleInvalid(f"Version {version} already takes all traffic, so there is nothing to canary it against: "
                          "upload a new version and canary that one (or canary another ready version).",
                          field="version")
    share = dict(current).get(version, 0)
    if share > others[0][1]:
        raise RuleInvalid(f"Version {version} takes {share} % now, the largest share; a canary gives a small share "
                          f"to a version beside the primary and never shrinks the primary: use promote to send all "
                          f"traffic to v{version}, or canary v{others[0][0]} instead.", field="version")
    primary = others[0][0]
    if percent == 0:
        return [(primary, WEIGHT_TOTAL)]
    return [(primary, WEIGHT_TOTAL - percent), (version, percent)]
