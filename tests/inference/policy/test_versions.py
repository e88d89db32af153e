"""The serving rule's weighted choice (inference.policy.versions): shares, stickiness, and rule checks."""

from __future__ import annotations

import random

import pytest

from inference.policy.versions import RuleInvalid, canary_rule, choose_version, rule_check, sticky_point


def test_a_90_10_split_over_1000_random_callers_gives_the_canary_10_percent_within_3() -> None:
    rng = random.Random(32)
    canary = sum(choose_version([90, 10], salt="7", user=None, draw=rng.random()) == 1 for _ in range(1000))
    assert 70 <= canary <= 130, canary


def test_a_90_10_split_over_1000_distinct_users_gives_the_canary_10_percent_within_3() -> None:
    canary = sum(choose_version([90, 10], salt="7", user=f"user-{i}", draw=0.0) == 1 for i in range(1000))
    assert 70 <= canary <= 130, canary


def test_each_user_always_sees_one_version_whatever_the_draw() -> None:
    rng = random.Random(1)
    for i in range(200):
        seen = {choose_version([50, 50], salt="3", user=f"u{i}", draw=rng.random()) for _ in range(20)}
        assert len(seen) == 1


def test_widening_a_canary_keeps_its_users_on_the_canary() -> None:
    users = [f"u{i}" for i in range(2000)]
    at_10 = {u for u in users if choose_version([90, 10], salt="s", user=u, draw=0.0) == 1}
    at_20 = {u for u in users if choose_version([80, 20], salt="s", user=u, draw=0.0) == 1}
    assert at_10 and at_10 <= at_20


def test_stickiness_is_per_adapter() -> None:
    points = [(sticky_point("a", f"u{i}"), sticky_point("b", f"u{i}")) for i in range(100)]
    assert sum(a != b for a, b in points) == 100


def test_zero_weights_are_never_chosen_and_no_weight_is_refused() -> None:
    assert {choose_version([0, 100, 0], salt="x", user=None, draw=d / 100) for d in range(100)} == {1}
    with pytest.raises(ValueError):
        choose_version([0, 0], salt="x", user=None, draw=0.5)


def test_rule_check_orders_heaviest_first_and_names_each_fault() -> None:
    assert rule_check([(3, 10), (2, 90)], ready={2, 3}) == [(2, 90), (3, 10)]
    assert rule_check([(2, 100), (3, 0)], ready={2, 3}) == [(2, 100)]
    for rule, fault in [([], "at least one"), ([(2, 50), (2, 50)], "once"), ([(4, 100)], "not ready"),
                        ([(2, 90), (3, 20)], "sum to 100"), ([(2, 101)], "outside")]:
        with pytest.raises(RuleInvalid, match=fault):
            rule_check(rule, ready={2, 3})


def test_canary_rule_keeps_the_primary_and_handles_the_edges() -> None:
    assert canary_rule([(3, 100)], version=4, percent=10) == [(3, 90), (4, 10)]
    assert canary_rule([(3, 90), (4, 10)], version=4, percent=25) == [(3, 75), (4, 25)]
    assert canary_rule([(3, 90), (4, 10)], version=4, percent=0) == [(3, 100)]
    assert canary_rule([(3, 100)], version=4, percent=100) == [(4, 100)]
    assert canary_rule([], version=1, percent=10) == [(1, 100)]
    with pytest.raises(RuleInvalid):
        canary_rule([(3, 100)], version=4, percent=120)


def test_a_canary_of_the_version_serving_alone_or_of_the_primary_is_refused_naming_the_fix() -> None:
    """Before: canary v1 10 % on ``[(1, 100)]`` answered ``[(1, 100)]`` (nothing changed), and on
    ``[(1, 90), (2, 10)]`` it answered ``[(2, 90), (1, 10)]`` (80 % of the traffic moved by a "canary")."""
    with pytest.raises(RuleInvalid, match="already takes all traffic.*upload a new version") as alone:
        canary_rule([(1, 100)], version=1, percent=10)
    assert alone.value.field == "version"
    with pytest.raises(RuleInvalid, match="already takes all traffic"):
        canary_rule([(1, 100)], version=1, percent=0)
    with pytest.raises(RuleInvalid, match=r"takes 90 % now.*use promote.*or canary v2 instead") as primary:
        canary_rule([(1, 90), (2, 10)], version=1, percent=10)
    assert primary.value.field == "version"
    # 100 % stays a promotion, and the canary itself may still widen, narrow or end.
    assert canary_rule([(1, 100)], version=1, percent=100) == [(1, 100)]
    assert canary_rule([(1, 90), (2, 10)], version=1, percent=100) == [(1, 100)]
    assert canary_rule([(1, 50), (2, 50)], version=2, percent=10) == [(1, 90), (2, 10)]
