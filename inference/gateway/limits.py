"""Per-tenant and per-key limits, atomic in Redis across every gateway process (in process without Redis).

Requests per minute and tokens per minute use fixed one-minute windows (AIBrix's Redis limiter,
``vllm-project/aibrix`` ``pkg/plugins/gateway/ratelimiter``); requests are also paced over the minute (GCRA, ``inference.policy.admission.rpm_pace``: bursts of about a second's
worth, as OpenAI quantizes its limits), so a client cannot pour its whole minute into the engines at once; concurrency is a sorted set of leases that expire on their own, so a process that dies mid-request frees its
slots after ``lease_s``; a stream that outlives its lease renews it (:meth:`RateLimiter.renew`, every third of the
lease while the relay runs), since the proxy timeout bounds each read, not the whole stream. One Lua script checks every scope (tenant, key) and only then increments them all: no
check-then-act race, nothing to roll back. A request reserves its prompt (estimated) plus ``max_tokens`` × ``n`` on
admission; :meth:`RateLimiter.settle` replaces the reservation with the real count at the end.

Without ``QUIVER_GATEWAY_REDIS_URL`` (the embedded demo, ``./scripts/demo``: SQLite and a ``filesystem://`` broker)
the same scripts run on an in-process Redis (fakeredis with lupa, a real Lua interpreter): exact for the demo's one
gateway process, per process where several run; the gateway logs ``gateway.limits_per_process_without_redis`` at
start. Each request's ``max_tokens`` cap is enforced by ``hygiene`` either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import redis.asyncio as aioredis
from django.conf import settings

from common.redis import async_client
from inference.gateway.errors import GatewayError
from inference.gateway.snapshot import Limits
from inference.gateway.upstream import engine_token_count
from inference.policy.admission import rpm_pace

logger = logging.getLogger(__name__)
WINDOW_S = 60
UNLIMITED = -1

ALIVE_PREFIX = "quiver:gw:alive:"  # + a gateway process's id: set while it runs (its leases are live)
ALIVE_TTL_S = 10
ALIVE_EVERY_S = 3.0  # the keep-alive's period (RateLimiter.keep_alive_forever), well inside the TTL

# KEYS: per scope (rpm window, tpm window, concurrency set, rpm pace TAT). ARGV: now_ms, reserve, lease id, lease
# expiry ms, key ttl s, then per scope (rpm limit, tpm limit, concurrency limit, pace interval ms, pace tolerance ms),
# -1 = unlimited. The pace is GCRA: a request conforms while its theoretical arrival time (TAT) is at most
# `tolerance` ahead of now; admitting moves the TAT on by one interval.
# Returns {1, used_rpm_1, used_tpm_1, ...} after admitting, or {0, scope index, kind, used, limit, wait ms}.
# A lease is "<process>:<id>"; each admit marks its process alive (ALIVE_PREFIX, ALIVE_TTL_S), and a concurrency set at
# its limit first drops the leases of processes no longer marked: a gateway killed mid-request locked a key with
# concurrency 1 out for its leases' whole life, 6 minutes (attack round), and now for at most ALIVE_TTL_S.
ADMIT_LUA = """
local n = #KEYS / 4
local now, reserve, lease, lease_exp, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]),
  tonumber(ARGV[5])
local alive_prefix, alive_ttl = '@ALIVE_PREFIX@', @ALIVE_TTL_S@
redis.call('SET', alive_prefix .. string.match(lease, '^[^:]+'), 1, 'EX', alive_ttl)
local tats = {}
for i = 1, n do
  local rl, tl, cl = tonumber(ARGV[5*i+1]), tonumber(ARGV[5*i+2]), tonumber(ARGV[5*i+3])
  local iv, tol = tonumber(ARGV[5*i+4]), tonumber(ARGV[5*i+5])
  local used_r = tonumber(redis.call('GET', KEYS[4*i-3]) or '0')
  local used_t = tonumber(redis.call('GET', KEYS[4*i-2]) or '0')
  if rl >= 0 and used_r + 1 > rl then return {0, i, 'requests', used_r, rl, -1} end
  if iv >= 0 then
    local tat = math.max(tonumber(redis.call('GET', KEYS[4*i]) or '0'), now)
    if tat - now > tol then return {0, i, 'pace', used_r, rl, tat - tol - now} end
    tats[i] = tat + iv
  end
  if tl >= 0 and used_t + reserve > tl then return {0, i, 'tokens', used_t, tl, -1} end
  if cl >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4*i-1], '-inf', now)
    local c = redis.call('ZCARD', KEYS[4*i-1])
    if c + 1 > cl then
      for _, held in ipairs(redis.call('ZRANGE', KEYS[4*i-1], 0, -1)) do
        local owner = string.match(held, '^([^:]+):')
        if owner and redis.call('EXISTS', alive_prefix .. owner) == 0 then redis.call('ZREM', KEYS[4*i-1], held) end
      end
      c = redis.call('ZCARD', KEYS[4*i-1])
    end
    if c + 1 > cl then return {0, i, 'concurrency', c, cl, -1} end
  end
end
local out = {1}
for i = 1, n do
  local r = redis.call('INCR', KEYS[4*i-3]); redis.call('EXPIRE', KEYS[4*i-3], ttl)
  local t = redis.call('INCRBY', KEYS[4*i-2], reserve); redis.call('EXPIRE', KEYS[4*i-2], ttl)
  if tonumber(ARGV[5*i+3]) >= 0 then
    redis.call('ZADD', KEYS[4*i-1], lease_exp, lease); redis.call('PEXPIRE', KEYS[4*i-1], lease_exp - now + 1000)
  end
  if tats[i] then redis.call('SET', KEYS[4*i], tats[i], 'PX', math.floor(tats[i] - now) + 1000) end
  table.insert(out, r); table.insert(out, t)
end
return out
"""
ADMIT_LUA = ADMIT_LUA.replace("@ALIVE_PREFIX@", ALIVE_PREFIX).replace("@ALIVE_TTL_S@", str(ALIVE_TTL_S))


# Settle: the delta onto each token window that still exists (INCRBY keeps its expiry; on a window that expired
# during a long stream it would create a key with none, left in Redis for good), the lease off each set.
# KEYS: the token windows, then the concurrency sets; ARGV: number of windows, delta, lease.
SETTLE_LUA = """
local windows, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, #KEYS do
  if i <= windows then
    if delta ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], delta) end
  else
    redis.call('ZREM', KEYS[i], ARGV[3])
  end
end
return 0
"""

# Renew: a long stream's lease gets a new expiry in each set that still holds it (ZADD XX never re-adds one that
# settle removed), and each set's own expiry is pushed past it. KEYS: the concurrency sets; ARGV: now ms, new lease
# expiry ms, lease. Returns how many sets held the lease.
RENEW_LUA = """
local now, exp, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
redis.call('SET', '@ALIVE_PREFIX@' .. string.match(lease, '^[^:]+'), 1, 'EX', @ALIVE_TTL_S@)
local renewed = 0
for i = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[i], lease)
  if score and tonumber(score) < exp then
    redis.call('ZADD', KEYS[i], 'XX', exp, lease)
    if redis.call('PTTL', KEYS[i]) < exp - now + 1000 then redis.call('PEXPIRE', KEYS[i], exp - now + 1000) end
  end
  if score then renewed = renewed + 1 end
end
return renewed
"""
RENEW_LUA = RENEW_LUA.replace("@ALIVE_PREFIX@", ALIVE_PREFIX).replace("@ALIVE_TTL_S@", str(ALIVE_TTL_S))

# Without Redis, the same scripts run in this process on fakeredis's in-memory server (with lupa, a real Lua
# interpreter): one source of truth for the limits whichever store holds them. One server per process, so a new
# event loop's RateLimiter keeps counting.
_LOCAL_SERVER = fakeredis.FakeServer()


def limits_mode_log() -> None:
    """At gateway start: without ``QUIVER_GATEWAY_REDIS_URL``, say once that limits hold per process only."""
    if not settings.QUIVER_GATEWAY_REDIS_URL:
        logger.warning("gateway.limits_per_process_without_redis", extra={
            "detail": "QUIVER_GATEWAY_REDIS_URL is unset: RPM, TPM and concurrency limits are counted in this "
                      "process only; with several gateway processes each admits up to the whole limit"})


@dataclass(frozen=True)
class Scope:
    """One limited party: ``name`` like ``tenant:7`` or ``key:12``, for messages ``label`` (``tenant acme``)."""

    name: str
    label: str
    limits: Limits


@dataclass
class Admission:
    """An admitted request's hold on its scopes: the window and reservation to settle, the lease to release."""

    scopes: Sequence[Scope]
    window: int
    reserved: int
    lease: str
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    lease_s: float = 0.0  # how long the concurrency lease lives from admission or its last renewal

    @property
    def holds_lease(self) -> bool:
        """Whether a scope limits concurrency, so the request holds a lease to renew and release."""
        return any(s.limits.concurrency is not None for s in self.scopes)


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``12ms`` (OpenAI's rate-limit guide, platform.openai.com/docs/guides/rate-limits)."""
    if seconds < 1:
        return f"{max(1, int(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"


def text_tokens_estimate(text: str) -> int:
    """A conservative token count for ``text``, without a tokenizer: ASCII at 4 characters per token (a common
    English average), each non-ASCII code point at least one token (CJK characters are one or more tokens each in
    the tokenizers we serve), a code point outside the Basic Multilingual Plane (most emoji) two, plus one.

    Three C-level passes at most (``isascii``, an ASCII and a UTF-16 encode, only for non-ASCII text): O(n) and
    cheap on the request path.
    """
    if text.isascii():
        return len(text) // 4 + 1
    ascii_chars = len(text.encode("ascii", "ignore"))
    astral = len(text.encode("utf-16-le", "surrogatepass")) // 2 - len(text)  # a surrogate pair for each
    return ascii_chars // 4 + (len(text) - ascii_chars) + astral + 1


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """A prompt's size in tokens for reservations, before tokenizing (the real count replaces it when the request
    settles).

    Token ids are counted one each; text by :func:`text_tokens_estimate`: ASCII at 4 characters per token, each
    non-ASCII code point as at least one token (two outside the BMP), so CJK or emoji text cannot pass a TPM limit
    by a multiple as it did at 4 bytes per token; each chat message adds 3 for its role and separators. A chat's
    ``tools`` and each message's fields besides ``role`` and ``content`` (``tool_calls``, ``name``, ``reasoning``,
    a developer message's ``tools``) count as their JSON: vLLM hands them to the chat template, which renders them
    into the prompt, and counting ``content`` alone let a 100 KB tool definition pass a TPM limit at 4 tokens.
    """
    prompt = body.get("prompt")
    if prompt is not None:
        items = prompt if isinstance(prompt, list) else [prompt]
        total = 0
        for item in items:
            if isinstance(item, str):
                total += text_tokens_estimate(item)
            elif isinstance(item, list):
                total += len(item)
            else:
                total += 1
        return total
    total = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        text = content if isinstance(content, str) else str(content or "")
        total += text_tokens_estimate(text) + 3  # role and separators
        if isinstance(message, dict) and len(message.keys() - {"role", "content"}):
            rest = {k: v for k, v in message.items() if k not in ("role", "content")}
            total += _json_tokens_estimate(rest)
    tools = body.get("tools")
    if tools:
        total += _json_tokens_estimate(tools)
    return total


# Tokens a chat template adds around the messages' own text (role markers, a default system line): the room every
# byte bound of a chat allows beside its JSON (here, and the billing cap in ``exchange.usage_bounded``).
CHAT_TEMPLATE_ROOM = 64


def prompt_token_bound(text: str) -> int:
    """A count never below ``text``'s real token count in a byte-level BPE tokenizer (Llama 3, GPT-2 and their
    kin: every token covers at least one UTF-8 byte), plus two for special tokens: the fallback when the engine's
    own count is not to be had."""
    return len(text.encode("utf-8", "surrogatepass")) + 2


def prompt_token_estimates(body: Mapping[str, Any]) -> list[int]:
    """:func:`estimate_prompt_tokens` per prompt, in order: one entry per item of a completions ``prompt`` list,
    one for a single prompt or a chat."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return [estimate_prompt_tokens({"prompt": item}) for item in prompt]
    return [estimate_prompt_tokens(body)]


async def prompt_token_counts(body: Mapping[str, Any], *, engine_url: str | None, node_key: str,
                              model: str, max_chars: int | None = None,
                              chat_bytes: Callable[[], Awaitable[int | None]] | None = None) -> list[int]:
    """Each prompt's real token count, from the engine that will run it (vLLM's ``/tokenize``: the base model's
    tokenizer, and for a chat its chat template with the tools rendered), so a TPM reservation cannot be outrun by
    text that tokenizes more densely than an estimate (``"~" * 500`` is 501 tokens, not 126).

    Token-id prompts count themselves. Where the engine gives no count, :func:`prompt_token_bound` of the text (a
    chat: of its messages and tools as JSON, plus 64 for the template) stands in: never below the real count. So
    does it for a text longer than ``max_chars``, which the engine is not asked to tokenize: a 4 MB prompt kept
    the node's tokenizer busy 5 to 10 s for every tenant before its 429 (attack round), while its byte bound is
    already past any TPM limit that would refuse it.

    Args:
        body: the upstream body (after hygiene).
        engine_url: an engine serving the request's base model; None when none is live (bounds only).
        max_chars: the longest text (characters; a chat: its messages and tools as JSON) sent to ``/tokenize``;
            None for no bound.
        node_key: that node's key.
        model: the base model's served name (its tokenizer is the adapters').
        chat_bytes: the size in bytes of a chat's prompt as its chat template renders it, or None
            (``PromptCounter.chat_bytes``): awaited only when the engine's count of a chat passes its JSON's bound,
            to cap it there instead (a template writing tools after a preamble: an honest count above the JSON's).

    Returns:
        One count per prompt, as :func:`prompt_token_estimates` orders them.
    """
    if "messages" in body:
        chat: dict[str, Any] = {"model": model, "messages": body["messages"]}
        if body.get("tools"):
            chat["tools"] = body["tools"]
        rendered = json.dumps([body["messages"], body.get("tools")], ensure_ascii=False, default=str)
        asked = engine_url is not None and (max_chars is None or len(rendered) <= max_chars)
        count = await engine_token_count(engine_url, node_key=node_key, body=chat) if asked else None  # type: ignore[arg-type]
        bound = prompt_token_bound(rendered) + CHAT_TEMPLATE_ROOM
        if count is None:
            return [bound]
        unbounded = has_non_text_part(body)
        if count > bound and chat_bytes is not None and not unbounded:
            size = await chat_bytes()
            bound = max(bound, (size or 0) + CHAT_TEMPLATE_ROOM)
        return [_engine_count_capped(count, bound, unbounded=unbounded)]
    prompt = body.get("prompt")
    items = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list) else [prompt]

    async def one(item: Any) -> int:
        if isinstance(item, list):
            return len(item)
        text = item if isinstance(item, str) else json.dumps(item)
        asked = engine_url is not None and (max_chars is None or len(text) <= max_chars)
        count = (await engine_token_count(engine_url, node_key=node_key, body={"model": model, "prompt": text})  # type: ignore[arg-type]
                 if asked else None)
        bound = prompt_token_bound(text)
        return bound if count is None else _engine_count_capped(count, bound)

    return list(await asyncio.gather(*(one(item) for item in items)))


def _engine_count_capped(count: int, bound: int, *, unbounded: bool = False) -> int:
    """An engine's count of a prompt, at most ``bound`` (its :func:`prompt_token_bound`, never below the real count
    of text): a host holding a node key, answering as its node, counted prompts in the billions, a 429 for every
    TPM-limited key it counted for (issue 30). ``unbounded``: a chat with a part other than text, whose tokens
    (an image's) the bytes do not bound; capped at ``bound`` × 1,000 then. A clamp is logged."""
    cap = bound * 1000 if unbounded else bound
    if count <= cap:
        return count
    logger.warning("gateway.engine_count_bounded", extra={"engine_count": count, "bound": cap})
    return cap


def has_non_text_part(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` is a chat with a content part other than text (an image's tokens are not bounded by its
    URL's bytes)."""
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            return True
    return False


def _json_tokens_estimate(value: Any) -> int:
    """:func:`text_tokens_estimate` of ``value`` as compact JSON, non-ASCII kept as text (as templates render it)."""
    return text_tokens_estimate(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


class RateLimiter:
    """Admits, settles and releases requests against their scopes' limits in Redis (one client per limiter), or in
    this process's in-memory Redis without ``QUIVER_GATEWAY_REDIS_URL`` (the same scripts either way)."""

    def __init__(self) -> None:
        self.process = uuid.uuid4().hex[:16]  # the owner part of this process's leases ("<process>:<id>")
        self._redis: aioredis.Redis | None = None
        self._script: Any = None
        self._settle_script: Any = None
        self._renew_script: Any = None

    def _client(self) -> Any:
        if self._redis is None:
            self._redis = (async_client(socket_timeout=2) if settings.QUIVER_GATEWAY_REDIS_URL
                           else fakeredis.FakeAsyncRedis(server=_LOCAL_SERVER))
            self._script = self._redis.register_script(ADMIT_LUA)
            self._settle_script = self._redis.register_script(SETTLE_LUA)
            self._renew_script = self._redis.register_script(RENEW_LUA)
        return self._redis

    @staticmethod
    def _keys(scope: Scope, window: int, pace: tuple[int, int] = (UNLIMITED, UNLIMITED)) -> list[str]:
        # The pace TAT is kept per (interval, tolerance): a TAT built at an old limit's interval (6 rpm: 10 s a
        # request) kept refusing for up to a minute after the limit was raised. A new limit starts a fresh pace;
        # the fixed window still counts the minute's requests against it.
        return [f"quiver:rl:{scope.name}:rpm:{window}", f"quiver:rl:{scope.name}:tpm:{window}",
                f"quiver:rl:{scope.name}:conc", f"quiver:rl:{scope.name}:pace:{pace[0]}:{pace[1]}"]

    async def admit(self, scopes: Sequence[Scope], *, reserve: int, length_field: str = "max_tokens",
                    prompt_tokens: int | None = None) -> Admission | None:
        """Admit one request reserving ``reserve`` tokens, or raise 429. None when nothing is limited.

        Args:
            scopes: the parties whose limits apply (tenant, key).
            reserve: tokens to hold: the estimated prompt plus the completion budget.
            length_field: the body's completion-length field, named when one request exceeds a TPM limit.
            prompt_tokens: the prompt's estimate within ``reserve``, for that message.

        Raises:
            GatewayError: 429 ``rate_limit_exceeded`` with ``Retry-After``/``retry-after-ms`` (and, for the
                per-minute windows, the ``x-ratelimit-*`` headers); one request bigger than a TPM limit is 429
                with ``x-should-retry: false`` and no ``Retry-After``: no wait makes it fit.
        """
        limited = [s for s in scopes if any(v is not None for v in (s.limits.rpm, s.limits.tpm, s.limits.concurrency))]
        if not limited:
            return None
        for scope in limited:
            if scope.limits.tpm is not None and reserve > scope.limits.tpm:
                split = "" if prompt_tokens is None else (
                    f" (the prompt, about {prompt_tokens}, plus up to {reserve - prompt_tokens} completion tokens)")
                raise GatewayError(429, f"Request too large for {scope.label} on tokens per min (TPM): Limit "
                                   f"{scope.limits.tpm}, Requested {reserve}{split}. Lower '{length_field}' or "
                                   f"shorten the prompt so the request fits in {scope.limits.tpm} tokens; it cannot "
                                   "succeed as sent, so retrying it will not help.",
                                   code="rate_limit_exceeded", type_="tokens", param=length_field,
                                   headers={"x-should-retry": "false"})
        now = time.time()
        window = int(now // WINDOW_S)
        reset = WINDOW_S - (now % WINDOW_S)
        lease = f"{self.process}:{uuid.uuid4().hex}"
        lease_s = settings.QUIVER_PROXY_TIMEOUT_S + settings.QUIVER_WARM_WAIT_S
        keys: list[str] = []
        args: list[Any] = [int(now * 1000), reserve, lease, int((now + lease_s) * 1000), WINDOW_S * 2]
        for s in limited:
            pace = (UNLIMITED, UNLIMITED) if not s.limits.rpm else rpm_pace(
                s.limits.rpm, burst_s=settings.QUIVER_LIMIT_BURST_S, burst_min=settings.QUIVER_LIMIT_BURST_MIN)
            keys += self._keys(s, window, pace)
            args += [_lim(s.limits.rpm), _lim(s.limits.tpm), _lim(s.limits.concurrency), *pace]
        self._client()
        try:
            answer = await self._script(keys=keys, args=args)
        except Exception as exc:  # noqa: BLE001 - Redis away: serve (fail open) rather than refuse everyone
            logger.warning("gateway.limiter_unavailable", extra={"error": repr(exc)})
            self._redis = None
            return None
        if int(answer[0]) == 0:
            scope = limited[int(answer[1]) - 1]
            kind = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
            wait = int(answer[5]) / 1000 if kind == "pace" else None
            raise self._refusal(scope, kind, int(answer[3]), int(answer[4]), reserve, reset, wait)
        headers = self._headers(limited, [int(x) for x in answer[1:]], reset)
        return Admission(scopes=limited, window=window, reserved=reserve, lease=lease, headers=headers,
                         lease_s=lease_s)

    @staticmethod
    def _headers(scopes: Sequence[Scope], used: list[int], reset: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        requests = [(s.limits.rpm, s.limits.rpm - used[2 * i]) for i, s in enumerate(scopes) if s.limits.rpm]
        tokens = [(s.limits.tpm, s.limits.tpm - used[2 * i + 1]) for i, s in enumerate(scopes) if s.limits.tpm]
        for kind, pairs in (("requests", requests), ("tokens", tokens)):
            if pairs:
                limit, remaining = min(pairs, key=lambda p: p[1])  # the scope closest to its limit
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, remaining))
                headers[f"x-ratelimit-reset-{kind}"] = _duration(reset)
        return headers

    @staticmethod
    def _refusal(scope: Scope, kind: str, used: int, limit: int, reserve: int, reset: float,
                 pace_wait: float | None = None) -> GatewayError:
        if kind == "pace":
            wait = max(0.001, pace_wait or 0.0)
            message = (f"Rate limit reached for {scope.label} on requests per min (RPM): Limit {limit}, spread over "
                       f"the minute (Used {used} this minute). Please try again in {_duration(wait)}.")
            type_ = "requests"
        elif kind == "concurrency":
            # Not the per-minute window: no x-ratelimit-*-requests headers (OpenAI clients read them as RPM), only
            # when to retry. A slot frees when one of the scope's requests ends, which the gateway cannot foresee.
            wait = 1.0
            message = (f"Concurrency limit reached for {scope.label}: Limit {limit} requests in flight. "
                       "Please try again when one finishes.")
            return GatewayError(429, message, code="rate_limit_exceeded", type_="requests",
                                headers={"Retry-After": "1", "retry-after-ms": str(int(wait * 1000))})
        else:
            wait = reset
            what = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
            asked = 1 if kind == "requests" else reserve
            message = (f"Rate limit reached for {scope.label} on {what}: Limit {limit}, Used {used}, Requested "
                       f"{asked}. Please try again in {_duration(wait)}.")
            type_ = kind
        headers = {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(int(wait * 1000)),
                   f"x-ratelimit-limit-{type_}": str(limit), f"x-ratelimit-remaining-{type_}": "0",
                   f"x-ratelimit-reset-{type_}": _duration(wait)}
        return GatewayError(429, message, code="rate_limit_exceeded", type_=type_, headers=headers)

    async def settle(self, admission: Admission | None, *, actual_tokens: int) -> None:
        """Replace the reservation with ``actual_tokens`` and free the concurrency lease (once; never raises)."""
        if admission is None or admission.settled:
            return
        admission.settled = True
        delta = actual_tokens - admission.reserved
        tpm_keys, conc_keys = [], []
        for scope in admission.scopes:
            _, tpm_key, conc_key, _ = self._keys(scope, admission.window)
            tpm_keys.append(tpm_key)
            if scope.limits.concurrency is not None:
                conc_keys.append(conc_key)
        try:
            self._client()
            await self._settle_script(keys=[*tpm_keys, *conc_keys], args=[len(tpm_keys), delta, admission.lease])
        except Exception as exc:  # noqa: BLE001 - a lost settle only skews one window; the lease expires by itself
            logger.warning("gateway.limit_settle_failed", extra={"error": repr(exc)})


    async def renew(self, admission: Admission | None) -> None:
        """Push the admission's concurrency lease ``lease_s`` past now, in one atomic call (no database query), in
        each scope's set that still holds it: a released (settled) or expired-and-dropped lease is not brought back.
        The relay calls it every third of the lease while a stream runs; if the process dies, the calls stop and the
        lease expires as before. Never raises (a lost renewal is retried at the next one)."""
        if admission is None or admission.settled or not admission.holds_lease:
            return
        conc_keys = [self._keys(s, admission.window)[2] for s in admission.scopes if s.limits.concurrency is not None]
        now = time.time()
        expiry = int((now + admission.lease_s) * 1000)
        try:
            self._client()
            await self._renew_script(keys=conc_keys, args=[int(now * 1000), expiry, admission.lease])
        except Exception as exc:  # noqa: BLE001 - Redis away: the next renewal tries again; the lease may lapse
            logger.warning("gateway.limit_renew_failed", extra={"error": repr(exc)})


    async def keep_alive_forever(self) -> None:
        """Mark this process alive every :data:`ALIVE_EVERY_S` until cancelled, so its leases outlive a quiet spell
        (a long non-streamed request, a warm wait); once it dies they are dropped within :data:`ALIVE_TTL_S` by the
        next admit that finds their set at its limit. Never raises but cancellation."""
        while True:
            try:
                await self._client().set(ALIVE_PREFIX + self.process, 1, ex=ALIVE_TTL_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: admits fail open meanwhile; retried next period
                logger.debug("gateway.limits_keep_alive_failed", extra={"error": repr(exc)})
                self._redis = None
            await asyncio.sleep(ALIVE_EVERY_S)


def _lim(value: int | None) -> int:
    return UNLIMITED if value is None else int(value)
