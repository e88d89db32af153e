"""The Redis limiter on a real Redis: each limit admits exactly up to its value, settles and releases correctly."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from inference.gateway.errors import GatewayError
from inference.gateway.limits import RateLimiter, Scope, _duration, estimate_prompt_tokens
from inference.gateway.snapshot import Limits


def _scope(**limits: int) -> Scope:
    return Scope(f"test:{uuid.uuid4().hex}", "tenant t", Limits(**limits))


def test_concurrency_admits_up_to_the_limit_and_a_release_frees_a_slot() -> None:
    async def run() -> None:
        limiter, scope = RateLimiter(), _scope(concurrency=2)
        first = await limiter.admit([scope], reserve=10)
        await limiter.admit([scope], reserve=10)
        with pytest.raises(GatewayError) as err:
            await limiter.admit([scope], reserve=10)
        assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
        await limiter.settle(first, actual_tokens=3)
        assert await limiter.admit([scope], reserve=10) is not None

    asyncio.run(run())


def test_rpm_and_tpm_with_settlement_and_headers() -> None:
    async def run() -> None:
        limiter = RateLimiter()
        rpm, tpm = _scope(rpm=3), _scope(tpm=100)
        admissions = [await limiter.admit([rpm], reserve=1) for _ in range(3)]
        assert admissions[-1].headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(GatewayError) as err:
            await limiter.admit([rpm], reserve=1)
        assert err.value.type == "requests" and "Limit 3, Used 3" in err.value.message
        held = await limiter.admit([tpm], reserve=80)
        assert held.headers["x-ratelimit-remaining-tokens"] == "20"
        with pytest.raises(GatewayError):
            await limiter.admit([tpm], reserve=30)
        await limiter.settle(held, actual_tokens=10)  # the real count replaces the reservation
        assert (await limiter.admit([tpm], reserve=30)).headers["x-ratelimit-remaining-tokens"] == "60"

    asyncio.run(run())


def test_a_refusal_on_one_scope_charges_none() -> None:
    async def run() -> None:
        limiter = RateLimiter()
        tenant, key = _scope(rpm=100), _scope(rpm=1)
        await limiter.admit([tenant, key], reserve=1)
        with pytest.raises(GatewayError):
            await limiter.admit([tenant, key], reserve=1)
        assert (await limiter.admit([tenant], reserve=1)).headers["x-ratelimit-remaining-requests"] == "98"

    asyncio.run(run())


def test_reset_durations_and_prompt_estimates() -> None:
    assert (_duration(0.012), _duration(1.2), _duration(360)) == ("12ms", "2s", "6m0s")
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "abcd" * 10}]}) == 14
