"""The gateway's read-through cache: one shared load per key that a cancelled caller cannot cancel for the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from inference.gateway.directory import TtlCache


def test_a_cancelled_caller_does_not_cancel_the_shared_load() -> None:
    calls: list[int] = []

    def slow_load(x: int) -> int:
        calls.append(x)
        time.sleep(0.2)
        return x * 2

    async def run() -> None:
        cache: TtlCache[int] = TtlCache(slow_load, lambda: (60.0, 120.0))
        leader = asyncio.create_task(cache.get(21))
        follower = asyncio.create_task(cache.get(21))
        await asyncio.sleep(0.05)
        leader.cancel()  # the admission dispatcher's bounded choice timing out
        assert await follower == 42
        assert leader.cancelled() and calls == [21]  # one load, and it finished
        assert await cache.get(21) == 42 and calls == [21]  # cached

    asyncio.run(run())


def _slow_count() -> tuple[list[int], Callable[[], int]]:
    """A loader taking 0.1 s that returns how many times it ran, and the list of its runs."""
    calls: list[int] = []

    def load() -> int:
        calls.append(1)
        time.sleep(0.1)
        return len(calls)

    return calls, load


def test_a_refresh_reads_again_in_the_background_and_serves_the_old_value_meanwhile() -> None:
    """The bus's ``placements`` message: the view is re-read now, not at the next soft TTL, and no request waits."""
    calls, load = _slow_count()

    async def run() -> None:
        cache: TtlCache[int] = TtlCache(load, lambda: (60.0, 120.0))
        assert await cache.get() == 1
        cache.refresh()
        started = time.monotonic()
        assert await cache.get() == 1  # served at once from the current value
        assert time.monotonic() - started < 0.05
        await asyncio.sleep(0.2)
        assert await cache.get() == 2 and len(calls) == 2

    asyncio.run(run())


def test_a_refresh_asked_during_a_read_reads_once_more_after_it() -> None:
    """The read in flight may have begun before the change that asked for the refresh: one more follows it (and only
    one, however many asks came meanwhile)."""
    calls, load = _slow_count()

    async def run() -> None:
        cache: TtlCache[int] = TtlCache(load, lambda: (60.0, 120.0))
        assert await cache.get() == 1
        cache.refresh()
        await asyncio.sleep(0.02)
        cache.refresh()
        cache.refresh()
        await asyncio.sleep(0.35)
        assert len(calls) == 3 and await cache.get() == 3

    asyncio.run(run())


def test_a_refresh_of_a_key_never_read_loads_nothing() -> None:
    calls: list[int] = []

    async def run() -> None:
        cache: TtlCache[int] = TtlCache(lambda: calls.append(1) or 1, lambda: (60.0, 120.0))
        cache.refresh()
        await asyncio.sleep(0.05)
        assert calls == []

    asyncio.run(run())
