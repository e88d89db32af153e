"""The invalidation bus on a real Redis: pings keep an idle subscription alive without flushing the caches, and a
published message drops exactly its entries."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.bus import invalidation_publish
from inference.gateway import bus


class _Recorder:
    """Stands in for ``Directory``: records each ``invalidate`` call."""

    def __init__(self) -> None:
        self.bus_ok = False
        self.calls: list[tuple[str, Any]] = []

    def invalidate(self, kind: str, ident: Any = None) -> None:
        self.calls.append((kind, ident))


def test_pings_on_an_idle_subscription_flush_nothing_and_messages_still_apply(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(bus, "PING_S", 0.1)
    directory = _Recorder()

    async def run() -> None:
        task = asyncio.create_task(bus.subscribe_forever(directory))  # type: ignore[arg-type]
        for _ in range(100):
            if directory.bus_ok:
                break
            await asyncio.sleep(0.05)
        assert directory.bus_ok
        await asyncio.sleep(1.0)  # about ten pings and health checks, each answered by a "pong"
        await asyncio.to_thread(invalidation_publish, "key", "abc123")
        for _ in range(40):
            if ("key", "abc123") in directory.calls:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # One flush for the subscription itself (messages may have been missed before it); none for the pongs.
    assert directory.calls == [("all", None), ("key", "abc123")]
