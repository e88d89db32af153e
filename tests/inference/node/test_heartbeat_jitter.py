"""Heartbeats are jittered: agents started together drift apart instead of beating in lock step."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from inference.node import heartbeat
from inference.node.heartbeat import HEARTBEAT_JITTER, heartbeat_loop, heartbeat_wait_s


def test_the_wait_spans_the_interval_plus_or_minus_the_jitter_and_keeps_its_mean():
    assert heartbeat_wait_s(5.0, 0.0) == pytest.approx(5.0 * (1 - HEARTBEAT_JITTER))
    assert heartbeat_wait_s(5.0, 0.5) == pytest.approx(5.0)
    assert heartbeat_wait_s(5.0, 0.999999) == pytest.approx(5.0 * (1 + HEARTBEAT_JITTER))
    rng = random.Random(7)
    waits = [heartbeat_wait_s(5.0, rng.random()) for _ in range(20000)]
    assert sum(waits) / len(waits) == pytest.approx(5.0, rel=0.01)
    # The listener's default floor (QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S = 0.5 s) never refuses a 1 s agent.
    assert min(heartbeat_wait_s(1.0, d / 100) for d in range(100)) >= 0.5


def test_the_loop_sleeps_the_jittered_wait_between_beats(monkeypatch):
    sent: list[float] = []
    waits: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(len(waits))
        return httpx.Response(200, json={"node": "n1", "healthy": True})

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise asyncio.CancelledError

    async def state() -> dict[str, Any]:
        return {"adapters": []}

    monkeypatch.setattr(heartbeat.asyncio, "sleep", fake_sleep)
    draws = iter([0.0, 0.5, 0.75])

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            await heartbeat_loop(http, "http://control", "tok", state, 5.0, draw=draws.__next__)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
    assert sent == [0, 1, 2]  # the first beat at once, then one per wait
    assert waits == pytest.approx([4.0, 5.0, 5.5])


def test_sixty_four_agents_started_together_spread_over_the_interval_within_two_minutes():
    """What the listener sees: the most beats landing in any 100 ms, 2 minutes after 64 agents start at once
    (lock step without jitter: all 64)."""
    rng = random.Random(1)
    interval = 5.0
    at = [0.0] * 64
    for _ in range(24):  # 24 beats of 5 s: 2 minutes
        at = [t + heartbeat_wait_s(interval, rng.random()) for t in at]
    phases = sorted(t % interval for t in at)
    busiest = max(sum(1 for q in phases if p <= q < p + 0.1) + sum(1 for q in phases if q < p + 0.1 - interval)
                  for p in phases)
    assert busiest <= 8
