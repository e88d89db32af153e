"""The limiter on a real Redis and, without ``QUIVER_GATEWAY_REDIS_URL``, in process (the same semantics per
process): each limit admits exactly up to its value, settles and releases correctly; a gateway process without
Redis enforces its tenants' limits and says at start that they are per process."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.gateway.errors import GatewayError
from inference.gateway.limits import ALIVE_PREFIX, RateLimiter, Scope, _duration, estimate_prompt_tokens
from inference.gateway.snapshot import Limits
from inference.policy.admission import rpm_pace


@pytest.fixture(autouse=True, params=["redis", "in_process"])
def store(request: pytest.FixtureRequest, settings: Any) -> str:
    """Every test runs against Redis and against the in-process store (no ``QUIVER_GATEWAY_REDIS_URL``)."""
    if request.param == "in_process":
        settings.QUIVER_GATEWAY_REDIS_URL = ""
    return str(request.param)


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
        # Not the per-minute window: no x-ratelimit-* headers describing something else.
        assert err.value.headers == {"Retry-After": "1", "retry-after-ms": "1000"}
        assert "Concurrency limit" in err.value.message and "Limit 2" in err.value.message
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


def test_non_ascii_prompts_are_estimated_at_least_a_token_per_code_point() -> None:
    """CJK and emoji tokenize at one or more tokens a character: at 4 bytes a token they were reserved a third
    (CJK) or a quarter (emoji) of that and passed a TPM limit by a multiple."""
    cjk = "你好世界" * 100  # 400 code points, 1,200 bytes (300 tokens at 4 bytes a token)
    emoji = "\U0001F600" * 100  # 100 code points outside the BMP, 400 bytes (100 at 4 bytes a token)
    assert estimate_prompt_tokens({"prompt": cjk}) == 401
    assert estimate_prompt_tokens({"prompt": emoji}) == 201
    assert estimate_prompt_tokens({"prompt": "abcd" * 10 + "é" * 10}) == 10 + 10 + 1  # ASCII still 4 chars a token
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": cjk}]}) == 404
    assert estimate_prompt_tokens({"prompt": ["abcd" * 10, cjk]}) == 11 + 401


def test_chat_text_outside_content_is_estimated_too() -> None:
    """Chat templates render ``tools`` and a message's ``tool_calls``, ``name`` and ``reasoning`` into the prompt
    (vLLM passes them to the template): counting ``content`` alone reserved 4 tokens for a request whose prompt was
    a 100 KB tool definition, and a TPM limit admitted it (and a burst of its like) at that price."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "abcd" * 50}
                                               for i in range(500)}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    hidden = len(json.dumps(tools, separators=(",", ":"))) // 4  # compact JSON at 4 characters a token
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "hi"}], "tools": tools}) > hidden
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(schema)}}
    assert estimate_prompt_tokens({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}) > hidden
    for field in ("name", "reasoning", "reasoning_content"):
        body = {"messages": [{"role": "assistant", "content": "", field: "你" * 1000}]}
        assert estimate_prompt_tokens(body) > 1000, field
    assert estimate_prompt_tokens({"messages": [{"role": "developer", "content": "x", "tools": tools}]}) > hidden
    # Content alone is estimated as before.
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "abcd" * 10}]}) == 14


def test_rpm_is_paced_over_the_minute_after_a_short_burst(settings) -> None:  # type: ignore[no-untyped-def]
    settings.QUIVER_LIMIT_BURST_S, settings.QUIVER_LIMIT_BURST_MIN = 1.0, 4

    async def run() -> None:
        # 2 a second, bursts of 4: the burst must only be sent within one 500 ms interval, which a loaded machine
        # also does (at 600 a minute, 10 admits in 100 ms failed under load).
        limiter, scope = RateLimiter(), _scope(rpm=120)
        for _ in range(4):
            await limiter.admit([scope], reserve=1)
        with pytest.raises(GatewayError) as err:
            await limiter.admit([scope], reserve=1)
        refused = err.value
        assert refused.status == 429 and refused.type == "requests" and "Limit 120" in refused.message
        assert 0 < int(refused.headers["retry-after-ms"]) <= 500 and refused.headers["Retry-After"] == "1"
        await asyncio.sleep(int(refused.headers["retry-after-ms"]) / 1000 + 0.01)
        assert await limiter.admit([scope], reserve=1) is not None  # one interval later, one more conforms
        with pytest.raises(GatewayError):
            await limiter.admit([scope], reserve=1)

    asyncio.run(run())


def test_rpm_pace_parameters() -> None:
    assert rpm_pace(300, burst_s=1, burst_min=20) == (200, 19 * 200)  # 5 a second after a burst of 20
    assert rpm_pace(12, burst_s=1, burst_min=20) == (5000, 11 * 5000)  # a small limit may go all at once
    assert rpm_pace(60000, burst_s=1, burst_min=20) == (1, 999)  # OpenAI's example: 1,000 a second
    with pytest.raises(ValueError, match="rpm"):
        rpm_pace(0, burst_s=1, burst_min=20)


def test_raising_an_rpm_limit_is_not_held_back_by_the_old_limits_pace(settings) -> None:  # type: ignore[no-untyped-def]
    settings.QUIVER_LIMIT_BURST_S, settings.QUIVER_LIMIT_BURST_MIN = 1.0, 20

    async def run() -> None:
        limiter, slow = RateLimiter(), _scope(rpm=6)
        for _ in range(6):
            await limiter.admit([slow], reserve=1)
        with pytest.raises(GatewayError):
            await limiter.admit([slow], reserve=1)
        raised = Scope(slow.name, slow.label, Limits(rpm=600))  # the operator raised it: the next request passes
        assert (await limiter.admit([raised], reserve=1)).headers["x-ratelimit-remaining-requests"] == "593"

    asyncio.run(run())


def test_one_request_over_the_tpm_limit_names_its_length_field_and_the_limit(settings) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        with pytest.raises(GatewayError) as err:
            await RateLimiter().admit([_scope(tpm=100)], reserve=1003, prompt_tokens=3,
                                      length_field="max_completion_tokens")
        refused = err.value
        assert (refused.status, refused.type, refused.param) == (429, "tokens", "max_completion_tokens")
        assert "Limit 100, Requested 1003" in refused.message and "'max_completion_tokens'" in refused.message
        assert refused.headers == {"x-should-retry": "false"}  # no Retry-After: no wait makes it fit

    asyncio.run(run())


@pytest.mark.parametrize("store", ["in_process"], indirect=True)
def test_in_process_leases_expire_and_old_windows_are_dropped(store: str, settings: Any) -> None:
    """A request that never settles (its task died) frees its slot after the lease, as Redis's sorted set does; the
    in-process store keeps no window past its expiry, so a long-running gateway does not grow."""
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 0.05, 0.0

    async def run() -> None:
        limiter, scope = RateLimiter(), _scope(concurrency=1, rpm=1000, tpm=10**6)
        await limiter.admit([scope], reserve=10)  # never settled
        with pytest.raises(GatewayError):
            await limiter.admit([scope], reserve=10)
        await asyncio.sleep(0.1)
        held = await limiter.admit([scope], reserve=10)
        assert held is not None and held.headers["x-ratelimit-remaining-requests"] == "998"

        # Every key the scripts left carries an expiry (windows 2 min, leases and TATs their own): nothing stays.
        local = limiter._client()
        keys = await local.keys("quiver:rl:test:*")
        assert keys and all([await local.pttl(k) > 0 for k in keys])

    asyncio.run(run())


@pytest.mark.parametrize("store", ["in_process"], indirect=True)
@pytest.mark.django_db(transaction=True)
def test_a_gateway_without_redis_enforces_limits_per_process_and_says_so(
        store: str, base_model: Any, tmp_path: Path) -> None:
    """The embedded demo's gateway (no ``QUIVER_GATEWAY_REDIS_URL``): a tenant's RPM limit refuses the request
    over it with OpenAI's 429 and headers, a key's concurrency and TPM limits apply, and the start-up log says once
    that limits are per process."""
    from tenants.services import api_key_create, limits_set
    from tests.factories import TenantFactory
    from tests.fixtures.stack import django_process_env, start_uvicorn

    tenant = TenantFactory()
    limits_set(tenant, limits={"rpm_limit": 2})
    _, plaintext = api_key_create(tenant, name="app")
    other = TenantFactory()
    key, plaintext2 = api_key_create(other, name="app")
    limits_set(key, limits={"tpm_limit": 100})
    name = f"quiver-gw-noredis-{uuid.uuid4().hex[:8]}"
    url, child = start_uvicorn(name, "config.asgi:application",
                               django_process_env(name, QUIVER_GATEWAY_REDIS_URL=""), tmp_path)
    try:
        while time.time() % 60 > 45:  # inside one fixed one-minute window
            time.sleep(0.5)

        def post(secret: str, max_tokens: int = 1) -> httpx.Response:
            return httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {secret}"},
                              json={"model": "tiny-llama", "prompt": "x", "max_tokens": max_tokens}, timeout=10)

        # Admitted requests find no node (503); the one over the limit is 429.
        answers = [post(plaintext) for _ in range(3)]
        assert [a.status_code for a in answers] == [503, 503, 429], [a.text for a in answers]
        refused = answers[-1]
        assert refused.json()["error"]["code"] == "rate_limit_exceeded" and "Limit 2" in refused.json()["error"]["message"]
        assert refused.headers["x-ratelimit-remaining-requests"] == "0" and int(refused.headers["retry-after"]) >= 1
        big = post(plaintext2, max_tokens=1000)
        assert big.status_code == 429 and big.headers["x-should-retry"] == "false", big.text
        assert post(plaintext2, max_tokens=60).status_code == 503  # admitted, then refunded (no node)
        assert post(plaintext2, max_tokens=60).status_code == 503  # the refund made room for it
    finally:
        child.stop()
    log = child.log.read_text()
    assert log.count("gateway.limits_per_process_without_redis") == 1, log


@pytest.mark.parametrize("store", ["redis"], indirect=True)
def test_a_settle_after_the_window_expired_leaves_no_key_behind(store: str, settings: Any) -> None:
    """A stream longer than the token window's life settles into nothing: no key without an expiry is left (INCRBY
    on a gone key would create one that Redis keeps for good)."""
    import redis

    async def run() -> None:
        limiter, scope = RateLimiter(), _scope(tpm=1000, concurrency=3)
        held = await limiter.admit([scope], reserve=100)
        _, tpm_key, conc_key, _ = limiter._keys(scope, held.window)
        sync = redis.Redis.from_url(settings.QUIVER_GATEWAY_REDIS_URL)
        assert sync.ttl(tpm_key) > 0 and sync.zcard(conc_key) == 1
        sync.delete(tpm_key)  # the window expired while the stream ran
        await limiter.settle(held, actual_tokens=250)
        assert not sync.exists(tpm_key)
        assert sync.zcard(conc_key) == 0  # the lease is freed all the same

        live = await limiter.admit([scope], reserve=100)  # a window still alive takes the delta, expiry kept
        await limiter.settle(live, actual_tokens=40)
        assert int(sync.get(tpm_key)) == 40 and sync.ttl(tpm_key) > 0

    asyncio.run(run())


def test_a_renewed_lease_outlives_its_life_and_is_still_released_and_still_expires(settings: Any) -> None:
    """A long stream renews its concurrency lease: the slot stays held past the lease's life, a release frees it
    (a renewal after it brings nothing back), and a lease no one renews (its process died) still expires."""
    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 0.3, 0.0

    async def run() -> None:
        limiter, scope = RateLimiter(), _scope(concurrency=1)
        held = await limiter.admit([scope], reserve=1)
        assert held is not None and held.holds_lease and held.lease_s == 0.3
        for _ in range(6):  # 0.6 s, twice the lease's life, renewed a third of the lease apart
            await asyncio.sleep(0.1)
            await limiter.renew(held)
        with pytest.raises(GatewayError) as err:
            await limiter.admit([scope], reserve=1)
        assert "Concurrency limit" in err.value.message
        await limiter.settle(held, actual_tokens=1)
        await limiter.renew(held)  # released: stays released
        dead = await limiter.admit([scope], reserve=1)
        held.settled = False
        await limiter.renew(held)  # even a renewal that slips past the settled flag finds no lease to bring back
        with pytest.raises(GatewayError):
            await limiter.admit([scope], reserve=1)  # `dead` holds the one slot
        await asyncio.sleep(0.4)  # `dead`'s process never renews: its lease expires
        assert await limiter.admit([scope], reserve=1) is not None
        assert dead is not None

    asyncio.run(run())


class _SlowStream:
    """An engine stream that sends one token every ``every_s`` for ``tokens`` tokens, then ``[DONE]``."""

    status_code = 200
    is_event_stream = True

    def __init__(self, tokens: int, every_s: float) -> None:
        self.tokens, self.every_s = tokens, every_s

    async def aiter_lines(self) -> Any:
        for i in range(self.tokens):
            await asyncio.sleep(self.every_s)
            yield ('data: {"id":"1","model":"t--bot--1","choices":[{"index":0,"text":"x"}],'
                   f'"usage":{{"prompt_tokens":1,"completion_tokens":{i + 1}}}}}')
            yield ""
        yield "data: [DONE]"

    def buffered_lines(self) -> list[str]:
        return []

    async def aclose(self) -> None:
        pass


@pytest.mark.django_db
def test_a_stream_longer_than_its_lease_keeps_its_concurrency_slot(
        monkeypatch: pytest.MonkeyPatch, settings: Any, base_model: Any) -> None:
    """Through the gateway: a tenant with a concurrency limit of 1 streams for four times the lease's life (the
    proxy timeout bounds each read, not the stream); its second request is refused all along, its admission
    running-slot hold stays counted, and once the stream ends the slot is free again."""
    from asgiref.sync import async_to_sync

    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_create
    from inference.gateway import exchange as gateway_exchange
    from inference.gateway.app import GatewayApp
    from inference.gateway.snapshot import NodeView
    from tenants.services import api_key_create, limits_set
    from tests.factories import TenantFactory

    settings.QUIVER_PROXY_TIMEOUT_S, settings.QUIVER_WARM_WAIT_S = 0.3, 0.0
    tenant = TenantFactory()
    limits_set(tenant, limits={"concurrency_limit": 1})
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    node = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)
    streams = [_SlowStream(tokens=12, every_s=0.1)]

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> _SlowStream:
        return streams.pop(0) if streams else _SlowStream(tokens=1, every_s=0.0)

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return node

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)

    app = GatewayApp(background=False)
    running: list[int] = []

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            async def post() -> httpx.Response:
                return await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                       json={"model": "bot", "prompt": "x", "max_tokens": 20, "stream": True})

            async def later(delay: float) -> int:
                await asyncio.sleep(delay)
                app.admission._sweep()  # what the admission loop does each tick: drops expired running-slot holds
                running.append(sum(app.admission.holding.get("n1", {}).values()))
                return (await post()).status_code

            long, during = await asyncio.gather(post(), later(0.9))  # 0.9 s: three times the lease's life
            assert "[DONE]" in long.text
            await asyncio.sleep(0.05)  # the release is spawned as the stream ends
            return [long.status_code, during, (await post()).status_code]

    assert async_to_sync(go)() == [200, 429, 200]
    assert running == [1]  # the stream's running-slot hold was renewed with its lease, not swept


def test_a_text_past_the_tokenize_bound_counts_its_bytes_without_asking_the_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MB prompt under a TPM limit kept the node's tokenizer busy 5 to 10 s for every tenant, only to be refused
    (attack round): past ``max_chars`` the byte bound counts it and the engine is not asked."""
    from inference.gateway import limits

    asked: list[dict[str, Any]] = []

    async def engine_token_count(url: str, *, node_key: str, body: dict[str, Any]) -> int:
        asked.append(body)
        return 7

    monkeypatch.setattr(limits, "engine_token_count", engine_token_count)
    big, small = "~" * 5000, "~" * 10

    def counts(body: dict[str, Any]) -> list[int]:
        return asyncio.run(limits.prompt_token_counts(body, engine_url="http://engine.invalid", node_key="k",
                                                      model="m", max_chars=1000))

    assert counts({"prompt": [small, big]}) == [7, 5002]
    assert [b["prompt"] for b in asked] == [small]
    asked.clear()
    chat = counts({"messages": [{"role": "user", "content": big}]})[0]
    assert asked == [] and chat >= 5000 + 64
    assert counts({"messages": [{"role": "user", "content": small}]}) == [7] and len(asked) == 1


def test_an_engines_count_is_capped_at_the_prompts_byte_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's engine answered 1,000,000,000 for a short prompt, a 429 for every TPM-limited key it counted for
    (issue 30): a count is at most ``prompt_token_bound`` of the text (a chat: of its JSON, plus the template's
    room); an honest count stands."""
    from inference.gateway import limits

    answer = [10**9]

    async def engine_token_count(url: str, *, node_key: str, body: dict[str, Any]) -> int:
        return answer[0]

    monkeypatch.setattr(limits, "engine_token_count", engine_token_count)

    def counts(body: dict[str, Any]) -> list[int]:
        return asyncio.run(limits.prompt_token_counts(body, engine_url="http://engine.invalid", node_key="k",
                                                      model="m"))

    assert counts({"prompt": ["~" * 10, "é"]}) == [12, 4]
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert counts(chat) == [limits.prompt_token_bound(json.dumps([chat["messages"], None])) + 64]
    answer[0] = 3
    assert counts({"prompt": ["~" * 10]}) == [3] and counts(chat) == [3]

    async def rendered_bytes() -> int:  # a template writing a preamble: its prompt is longer than the request
        return 900

    def chat_count(value: int) -> int:
        answer[0] = value
        return asyncio.run(limits.prompt_token_counts(chat, engine_url="http://engine.invalid", node_key="k",
                                                      model="m", chat_bytes=rendered_bytes))[0]

    assert chat_count(412) == 412  # honest, above the JSON's bound: the rendered prompt's bound keeps it
    assert chat_count(10**9) == 900 + 64


def test_a_dead_gateway_processs_leases_are_dropped_when_the_set_is_full() -> None:
    """A gateway killed mid-request never settles its lease: with concurrency 1 its key was locked out for the
    lease's whole life, 6 minutes (attack round). Each process marks itself alive (on every admit and renewal, and
    every few seconds while it runs); a full set drops the leases of processes no longer marked. A live process's
    lease still holds."""
    async def run() -> None:
        scope = _scope(concurrency=1)
        dead, other = RateLimiter(), RateLimiter()
        await dead.admit([scope], reserve=1)  # never settled
        with pytest.raises(GatewayError) as err:
            await other.admit([scope], reserve=1)
        assert "Concurrency limit" in err.value.message  # alive: its lease holds
        await dead._client().delete(ALIVE_PREFIX + dead.process)  # its mark lapses (ALIVE_TTL_S after death)
        assert await other.admit([scope], reserve=1) is not None
        with pytest.raises(GatewayError):  # the new lease is live: the limit holds again
            await dead.admit([scope], reserve=1)

        keeper = RateLimiter()
        task = asyncio.get_running_loop().create_task(keeper.keep_alive_forever())
        await asyncio.sleep(0.05)
        assert await keeper._client().ttl(ALIVE_PREFIX + keeper.process) > 0
        task.cancel()

    asyncio.run(run())
