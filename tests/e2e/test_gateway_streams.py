"""100 concurrent streams through a separate gateway process hold at most a few database connections, and each
is metered with the tokens it received (real vLLM node, PostgreSQL, Redis)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from django.db import connection

from inference.metering.models import UsageRecord
from inference.metering.usage import usage_drain
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.stack import GatewayProcess

pytestmark = pytest.mark.django_db(transaction=True)
STREAMS = 100
TOKENS = 24


def _connections(application_name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
        return int(cur.fetchone()[0])


async def _stream(client: httpx.AsyncClient, started: list[int]) -> int:
    body = {"model": "tiny-llama", "prompt": "the cat", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    chunks = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                if chunks == 0:
                    started.append(1)
                chunks += 1
            assert '"error"' not in line
    return chunks


async def _run(gw: GatewayProcess, key: str) -> tuple[list[int], int]:
    started: list[int] = []
    peak = 0
    limits = httpx.Limits(max_connections=STREAMS + 10)
    async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=300,
                                 limits=limits) as client:
        tasks = [asyncio.create_task(_stream(client, started)) for _ in range(STREAMS)]
        while not all(t.done() for t in tasks):
            peak = max(peak, await asyncio.to_thread(_connections, gw.application_name))
            await asyncio.sleep(0.05)
        return [t.result() for t in tasks], peak


def test_100_streams_hold_at_most_a_few_database_connections(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    gw = gateway_processes[0]
    # Wait for this process to see the node (its fleet view refreshes twice a second).
    deadline = time.monotonic() + 20
    while httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                     json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    chunks, peak = asyncio.run(_run(gw, key))
    # Under load vLLM folds several tokens into one delta, so chunks ≤ tokens; the metering below counts tokens.
    assert all(1 <= c <= TOKENS for c in chunks), chunks
    assert 1 <= peak <= 3, peak
    deadline = time.monotonic() + 15
    records = UsageRecord.objects.filter(tenant=tenant, stream=True)
    while records.count() < STREAMS:
        assert time.monotonic() < deadline, records.count()
        usage_drain()
        time.sleep(0.1)
    assert set(records.values_list("status_code", "completion_tokens")) == {(200, TOKENS)}
    assert all(r.ttft_ms is not None and 0 < r.ttft_ms <= r.latency_ms for r in records)


async def _chunks_and_tokens(client: httpx.AsyncClient, key: str, tokens: int) -> tuple[int, int]:
    """(content chunks, completion tokens by the final usage) of one streamed completion."""
    body = {"model": "tiny-llama", "prompt": "the cat", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    chunks, completion = 0, -1
    async with client.stream("POST", "/v1/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            assert '"error"' not in line
            if '"choices":[]' in line:
                completion = json.loads(line[6:])["usage"]["completion_tokens"]
            else:
                chunks += 1
    return chunks, completion


def test_the_heaviest_tenants_streams_come_in_coarse_chunks_and_are_billed_every_token(
        live_node, gateway_processes: list[GatewayProcess]) -> None:  # type: ignore[no-untyped-def]
    """Beside another tenant's running stream, a tenant with more streams on the node gets vLLM's
    ``stream_interval`` (``QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL``, 8): the engine really sends fewer, larger chunks,
    and every token is still delivered and metered."""
    quiet, heavy = TenantFactory(), TenantFactory()
    _, quiet_key = api_key_create(quiet, name="app")
    _, heavy_key = api_key_create(heavy, name="app")
    gw = gateway_processes[0]
    tokens = 64
    deadline = time.monotonic() + 30  # until this process sees a live node (its fleet view refreshes twice a second)
    while httpx.post(f"{gw.url}/v1/completions", headers={"Authorization": f"Bearer {quiet_key}"}, timeout=60,
                     json={"model": "tiny-llama", "prompt": "x", "max_tokens": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)

    async def run() -> tuple[tuple[int, int], list[tuple[int, int]]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=300) as client:
            long = asyncio.create_task(_chunks_and_tokens(client, quiet_key, 400))
            await asyncio.sleep(0.3)  # the quiet tenant's stream is running
            first = await _chunks_and_tokens(client, heavy_key, 1)
            assert first[1] == 1
            heavy_streams = await asyncio.gather(*(_chunks_and_tokens(client, heavy_key, tokens) for _ in range(4)))
            return await long, list(heavy_streams)

    (quiet_chunks, quiet_tokens), heavy_streams = asyncio.run(run())
    assert quiet_tokens == 400 and all(t == tokens for _, t in heavy_streams), (quiet_tokens, heavy_streams)
    # The first of the four starts level with the quiet tenant (one each): per token. The others start heavier.
    coarse = [c for c, _ in heavy_streams if c <= tokens // 8 + 1]
    assert len(coarse) >= 3, heavy_streams
