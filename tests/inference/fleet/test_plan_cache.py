"""A process's copy of the reconciler's plan is read whole from Redis only when the plan changed
(``inference.fleet.plan``: past ``PLAN_CACHE_S`` a reader asks for the plan's digest first)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common.redis import sync_client
from inference.fleet import plan
from inference.fleet.plan import plan_all, plan_key, plan_publish
from tests.fixtures.fleet_plan import plan_forget


@pytest.fixture
def whole_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each HGETALL of the plan (a whole read), counted; the plan is dropped afterwards."""
    client = sync_client()
    assert client is not None
    reads: list[str] = []
    hgetall = type(client).hgetall

    def counted(self: Any, name: str) -> Any:
        reads.append(name)
        return hgetall(self, name)

    monkeypatch.setattr(type(client), "hgetall", counted)
    yield reads
    client.delete(plan_key())
    plan_forget()


def _expire() -> None:
    """Age this process's copy past ``PLAN_CACHE_S`` (its contents and digest kept)."""
    plan._cached = (float("-inf"), plan._cached[1])


def _published_elsewhere(plans: dict[int, tuple[str, ...]]) -> None:
    """Publish ``plans`` as another process would: this process's copy stays the old one."""
    kept, gen = plan._cached, plan._cached_gen
    plan_publish(plans)
    plan._cached, plan._cached_gen = kept, gen


def test_the_plan_is_read_whole_only_when_its_digest_moved(whole_reads: list[str]) -> None:
    plan_publish({1: ("n1", "n2"), 2: ("n2",)})
    plan_forget()
    assert plan_all() == {1: ("n1", "n2"), 2: ("n2",)} and len(whole_reads) == 1
    _expire()
    assert plan_all() == {1: ("n1", "n2"), 2: ("n2",)} and len(whole_reads) == 1  # digest asked, unchanged
    _published_elsewhere({2: ("n2",), 1: ("n1", "n2")})  # the same homes in another order: the same digest
    _expire()
    assert plan_all() == {1: ("n1", "n2"), 2: ("n2",)} and len(whole_reads) == 1
    _published_elsewhere({1: ("n3",), 2: ("n2",)})
    _expire()
    assert plan_all() == {1: ("n3",), 2: ("n2",)} and len(whole_reads) == 2
    _published_elsewhere({})  # no plan any more (or it expired): the copy goes too
    _expire()
    assert plan_all() == {} and len(whole_reads) == 3
