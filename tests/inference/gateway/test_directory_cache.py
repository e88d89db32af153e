"""The gateway's read-through cache: one shared load per key that a cancelled caller cannot cancel for the others."""

from __future__ import annotations

import asyncio
import time

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
