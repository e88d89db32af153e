"""The scale run's derived figures."""

from __future__ import annotations

import pytest

from devtools.hollow.figures import waits


def test_each_eviction_waits_until_the_first_task_start_after_it_and_each_start_is_used_once() -> None:
    sent = [10.0, 20.0, 20.5, 100.0]
    began = [9.0, 10.25, 20.75, 21.0, 400.0]  # 9.0: a task of an earlier eviction; 400: too late to be this one's
    assert waits(sent, began) == pytest.approx([250.0, 750.0, 500.0])


def test_no_start_no_wait() -> None:
    assert waits([1.0], []) == []
