"""The reconciler's warm backoff per (version, node): pure, clock passed in."""

from __future__ import annotations

from inference.policy.backoff import (
    WarmBackoff,
    WarmBackoffConfig,
    warm_backoff_asked,
    warm_backoff_delay,
    warm_backoff_due,
    warm_backoff_loaded,
)

CONFIG = WarmBackoffConfig(base_s=30.0, cap_s=900.0, early_s=3.0)


def test_the_delay_doubles_from_one_period_to_the_cap() -> None:
    assert [warm_backoff_delay(f, CONFIG) for f in range(8)] == [0, 30, 60, 120, 240, 480, 900, 900]
    assert warm_backoff_delay(10_000, CONFIG) == 900  # no overflow however long it fails


def test_a_pair_is_due_when_never_asked_or_once_its_delay_passed_less_a_little_early() -> None:
    assert warm_backoff_due(None, now=0.0, config=CONFIG)
    once = warm_backoff_asked(None, now=100.0)
    assert once == WarmBackoff(failures=1, asked_at=100.0)
    assert not warm_backoff_due(once, now=100.0, config=CONFIG)
    assert warm_backoff_due(once, now=128.0, config=CONFIG)  # the next pass, started a little early, is due
    twice = warm_backoff_asked(once, now=130.0)
    assert not warm_backoff_due(twice, now=160.0, config=CONFIG)  # skips a pass
    assert warm_backoff_due(twice, now=190.0, config=CONFIG)


def test_passes_every_30_s_ask_a_failing_pair_at_30_s_doubling_to_15_min() -> None:
    state, asked = None, []
    for now in range(0, 3600, 30):
        if warm_backoff_due(state, now=now, config=CONFIG):
            state = warm_backoff_asked(state, now=now)
            asked.append(now)
    assert asked == [0, 30, 90, 210, 450, 930, 1830, 2730]


def test_it_resets_only_once_the_engine_has_held_it_for_twice_the_delay() -> None:
    state = WarmBackoff(failures=3, asked_at=1000.0)  # delay 120 s
    assert warm_backoff_loaded(None, now=0.0, config=CONFIG) is None
    assert warm_backoff_loaded(state, now=1030.0, config=CONFIG) == state  # loaded, but perhaps undone again
    assert warm_backoff_loaded(state, now=1240.0, config=CONFIG) is None  # held 240 s: settled, starts over
    first = warm_backoff_asked(None, now=0.0)
    assert warm_backoff_loaded(first, now=30.0, config=CONFIG) == first
    assert warm_backoff_loaded(first, now=60.0, config=CONFIG) is None  # a plain success resets at the 2nd pass
