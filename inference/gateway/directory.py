"""In-process caches of keys, model targets and the fleet, so an ordinary gateway request makes no database query.

Loaders are plain ORM reads run through ``sync_to_async(thread_sensitive=True)``: outside a Django request that is
asgiref's one shared thread, so one database connection per gateway process, never held while a request streams or
waits for a warm (and inside ``async_to_sync``, as in tests, the caller's own thread and connection). Entries are served while fresh; past ``soft_ttl`` the next hit
refreshes in the background and still serves the old view; past ``hard_ttl`` the hit waits for the database.
Invalidation messages (``inference.gateway.bus``) drop entries at once on every process; without a working bus the
TTLs shrink to ``QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S`` so a revoked key still stops within about a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from inference.gateway.errors import GatewayError
from inference.gateway.fleet_reader import FleetReader
from inference.gateway.snapshot import FleetView, KeyView, Limits, RuleView, TargetView

logger = logging.getLogger(__name__)
V = TypeVar("V")
DB_RETRY_AFTER_S = 5  # as the control-plane API answers (common.exceptions)

def _kept_connection_ok() -> bool:
    """Whether the thread holds a connection that psycopg does not already know to be closed or broken (no round
    trip); one it knows is dead is dropped here."""
    raw = connection.connection
    if raw is None:
        return False
    if getattr(raw, "closed", False) or getattr(raw, "broken", False):
        connection.close()
        return False
    return True


def _left_in_transaction() -> bool:
    """Whether the thread's connection is inside a transaction psycopg knows of (no round trip)."""
    raw = connection.connection
    info = getattr(raw, "info", None)
    status = getattr(info, "transaction_status", None)
    return status is not None and int(status) != 0  # psycopg.pq.TransactionStatus.IDLE


def _in_db_thread(fn: Callable[..., Any], *args: Any) -> Any:
    # Django's CONN_MAX_AGE rules before each call (close_old_connections): under the ASGI servers' psycopg pool
    # (settings.base.pooled) that hands the connection back to the pool, so no PostgreSQL backend starts per call.
    # A connection PostgreSQL dropped (restart, idle timeout) fails the call: closed, and the call runs once more
    # on a fresh connection. One left inside a transaction is closed at once, not at the next call: it would hold
    # locks (a test database's flush deadlocked on one) and read a stale snapshot. Never inside a caller's
    # transaction (a test lending its thread through async_to_sync): no closing or retrying there.
    if connection.in_atomic_block:
        return fn(*args)
    close_old_connections()
    kept = _kept_connection_ok()
    try:
        return _closing_open_transaction(fn, *args)
    except (OperationalError, InterfaceError):
        connection.close()
        if not kept:
            raise
    except Exception:
        connection.close()
        raise
    try:
        return _closing_open_transaction(fn, *args)
    except Exception:
        connection.close()
        raise


def _closing_open_transaction(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    finally:
        if _left_in_transaction():
            logger.warning("gateway.db_connection_left_in_transaction", extra={"call": getattr(fn, "__name__", "")})
            connection.close()


async def db_call(fn: Callable[..., V], *args: Any) -> V:
    """Run a synchronous ORM function in the gateway's database thread.

    Raises:
        GatewayError: 503 ``database_unavailable`` (with ``Retry-After``) when the database refused or dropped the
            connection (PostgreSQL restarting); the next call connects afresh, so the gateway needs no restart.
    """
    try:
        return await sync_to_async(_in_db_thread, thread_sensitive=True)(fn, *args)
    except (OperationalError, InterfaceError) as exc:
        logger.warning("gateway.database_unavailable", extra={"error": repr(exc)})
        raise GatewayError(503, "The database is unavailable right now; retry in a few seconds.",
                           code="database_unavailable", type_="server_error",
                           headers={"Retry-After": str(DB_RETRY_AFTER_S)}) from exc


def _limits(obj: Any) -> Limits:
    return Limits(rpm=getattr(obj, "rpm_limit", None), tpm=getattr(obj, "tpm_limit", None),
                  concurrency=getattr(obj, "concurrency_limit", None), max_tokens=getattr(obj, "max_tokens_limit", None))


def _priority(tenant_class: str | None, key_class: str | None) -> int:
    """vLLM's ``priority`` for a key: its own class if set, never above (numerically below) its tenant's."""
    from tenants.models import PRIORITY_CLASSES

    tenant_p = PRIORITY_CLASSES.get(tenant_class or "normal", 0)
    return max(tenant_p, PRIORITY_CLASSES.get(key_class, tenant_p)) if key_class else tenant_p


def load_key(key_id: str) -> KeyView | None:
    """The key with ``key_id`` (any state: the caller checks enabled/expiry), or None."""
    from tenants.models import ApiKey

    key = ApiKey.objects.select_related("tenant").filter(key_id=key_id).first()
    if key is None:
        return None
    return KeyView(pk=key.pk, key_id=key.key_id, digest=key.digest, enabled=key.enabled, expires_at=key.expires_at,
                   scopes=frozenset(key.scopes), tenant_id=key.tenant_id, tenant_slug=key.tenant.slug,
                   tenant_limits=_limits(key.tenant), key_limits=_limits(key),
                   priority=_priority(key.tenant.priority_class, key.priority_class),
                   adapters=frozenset(str(a) for a in (key.adapters or [])))


def _version_target(requested: str, adapter: Any, version: Any) -> TargetView:
    version.adapter = adapter
    return TargetView(requested=requested, base_model_id=adapter.base_model_id,
                      base_model_name=adapter.base_model.base_model_name, served_name=version.served_name,
                      version_id=version.pk, version_number=version.number, r=version.r, adapter_id=adapter.pk,
                      adapter_limits=Limits(rpm=adapter.rpm_limit, tpm=adapter.tpm_limit))


def load_rule(tenant_id: int, model: str) -> RuleView | str:
    """What ``model`` reaches for the tenant: a base model; ``name@N``, version N of the tenant's adapter while it is
    ready; or ``name``, the adapter's serving rule over its ready versions (its first ready version while the rule
    names none). Else ``"not_found"`` (unknown or another tenant's), ``"version_not_found"`` (the tenant's adapter
    exists but ``name@N`` is no ready version of it: never uploaded, deleted, rejected or validating) or
    ``"not_ready"`` (the adapter has no ready version yet)."""
    from adapters_app.models import Adapter, AdapterVersion, BaseModel
    from adapters_app.serving import rule_pairs

    base = BaseModel.objects.filter(base_model_name=model).first()
    if base is not None:
        return RuleView(targets=(TargetView(requested=model, base_model_id=base.pk, base_model_name=base.base_model_name,
                                            served_name=base.base_model_name),))
    name, at, number = model.partition("@")
    adapter = Adapter.objects.select_related("base_model", "tenant").filter(tenant_id=tenant_id, name=name).first()
    if adapter is None:
        return "not_found"
    ready = AdapterVersion.objects.filter(adapter=adapter, status=AdapterVersion.Status.READY)
    if at:
        if not number.isascii() or not number.isdigit() or len(number) > 9:
            return "version_not_found"
        pinned = ready.filter(number=int(number)).first()
        # Named as `name@N` however the number was written (`name@01`): usage groups by this name.
        canonical = f"{name}@{int(number)}"
        return (RuleView(targets=(_version_target(canonical, adapter, pinned),)) if pinned is not None
                else "version_not_found")
    rule = [(n, w) for n, w in rule_pairs(adapter.serving_rule) if w > 0]
    versions = {v.number: v for v in ready.filter(number__in=[n for n, _ in rule])}
    rule = [(n, w) for n, w in rule if n in versions]
    if not rule:
        first = ready.order_by("number").first()
        if first is None:
            return "not_ready"
        versions, rule = {first.number: first}, [(first.number, 100)]
    return RuleView(targets=tuple(_version_target(model, adapter, versions[n]) for n, _ in rule),
                    weights=tuple(w for _, w in rule), salt=str(adapter.pk))


def load_target(tenant_id: int, model: str) -> TargetView | str:
    """:func:`load_rule`'s target for ``model`` when it reaches one version (the heaviest of a split); else its
    error code (``"not_found"``/``"not_ready"``)."""
    rule = load_rule(tenant_id, model)
    return rule if isinstance(rule, str) else rule.targets[0]


class _Entry(Generic[V]):
    __slots__ = ("value", "at", "refreshing")

    def __init__(self, value: V, at: float):
        self.value = value
        self.at = at
        self.refreshing = False


class TtlCache(Generic[V]):
    """Async read-through cache over a synchronous loader (stale-while-revalidate, one load per key at a time).

    Args:
        loader: ``loader(*key)`` run in the database thread; its result (including None) is cached.
        ttl: ``ttl() -> (soft, hard)`` seconds, read on every hit so a bus outage shortens them at once.
        max_entries: the oldest loaded entries go first past this many (unknown keys are cached too).
        is_miss: which results are misses (an unknown key, a model not found); they are kept apart, at most
            ``max_misses``, so anyone's stream of made-up keys or names never evicts the entries that serve.
    """

    def __init__(self, loader: Callable[..., V], ttl: Callable[[], tuple[float, float]], max_entries: int = 100_000,
                 *, is_miss: Callable[[V], bool] | None = None, max_misses: int = 10_000):
        self._max_entries = max_entries
        self._loader = loader
        self._ttl = ttl
        self._entries: dict[tuple[Hashable, ...], _Entry[V]] = {}
        # Misses apart: one cache for both let 100,000 random bearer tokens (no credential needed), or 20,000
        # made-up model names, push every tenant's keys and targets out, each next request then a database read on
        # the process's one database thread, behind the flood's own reads (attack round).
        self._is_miss = is_miss
        self._max_misses = max_misses
        self._misses: dict[tuple[Hashable, ...], _Entry[V]] = {}
        self._loading: dict[tuple[Hashable, ...], asyncio.Task[V]] = {}
        self._again: set[tuple[Hashable, ...]] = set()  # keys to read once more when their load in flight ends
        self.generation = 0

    async def get(self, *key: Hashable) -> V:
        """The cached value for ``key``, loading it when absent or past the hard TTL."""
        entry = self._entries.get(key) or self._misses.get(key)
        now = time.monotonic()
        if entry is not None:
            soft, hard = self._ttl()
            age = now - entry.at
            if age < soft:
                return entry.value
            if age < hard:
                if not entry.refreshing:
                    entry.refreshing = True
                    self._shared(tuple(key)).add_done_callback(_log_failure)
                return entry.value
        return await self._load(tuple(key))

    async def _load(self, key: tuple[Hashable, ...]) -> V:
        # One load per key, in a task of its own: a caller cancelled mid-load (the admission dispatcher's bounded
        # node choice, a client gone) must not cancel the load the other callers share (bench_fairness saw it
        # turn their requests into 500s).
        return await asyncio.shield(self._shared(key))

    def _shared(self, key: tuple[Hashable, ...]) -> asyncio.Task[V]:
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fill(key))
            task.add_done_callback(_retrieved)
            self._loading[key] = task
        return task

    def refresh(self, *key: Hashable) -> None:
        """Start reading ``key`` again now, in the background, serving its current value until the read is in
        (nothing when absent: the next :meth:`get` loads it). A read already in flight may have begun before the
        change that asked for this one, so another follows it. Must run on the event loop's thread."""
        key = tuple(key)
        if key in self._loading:
            self._again.add(key)
        elif key in self._entries or key in self._misses:
            self._shared(key).add_done_callback(_log_failure)

    async def _fill(self, key: tuple[Hashable, ...]) -> V:
        generation = self.generation
        try:
            value = await db_call(self._loader, *key)
        finally:
            self._loading.pop(key, None)
            if key in self._again:
                self._again.discard(key)
                self._shared(key).add_done_callback(_log_failure)
        if generation == self.generation:  # an invalidation during the load must not be overwritten by stale data
            self._entries.pop(key, None)
            self._misses.pop(key, None)
            miss = self._is_miss is not None and self._is_miss(value)
            entries, bound = (self._misses, self._max_misses) if miss else (self._entries, self._max_entries)
            entries[key] = _Entry(value, time.monotonic())
            while len(entries) > bound:  # bounded: random bearer tokens must not grow it forever
                del entries[next(iter(entries))]
        return value

    def peek(self, *key: Hashable) -> V | None:
        """The cached value for ``key`` whatever its age, without loading (None when absent)."""
        entry = self._entries.get(key) or self._misses.get(key)
        return entry.value if entry is not None else None

    def invalidate(self, predicate: Callable[[tuple[Hashable, ...]], bool] | None = None) -> int:
        """Drop entries whose key matches ``predicate`` (all when None); returns how many."""
        self.generation += 1
        dropped = 0
        for entries in (self._entries, self._misses):
            doomed = list(entries) if predicate is None else [k for k in entries if predicate(k)]
            for k in doomed:
                del entries[k]
            dropped += len(doomed)
        return dropped


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Mark a shared load's exception retrieved (its callers re-raise it; none may be left to)."""
    if not task.cancelled():
        task.exception()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("gateway.cache_refresh_failed", extra={"error": repr(task.exception())})


def _is_none(value: object) -> bool:
    return value is None


def _is_not_found(value: object) -> bool:
    return value in ("not_found", "version_not_found")


class Directory:
    """The gateway process's caches: ``keys`` (key_id → KeyView | None), ``targets`` ((tenant_id, model) →
    RuleView | error code) and the fleet view (refreshed every ``QUIVER_GATEWAY_FLEET_REFRESH_S``)."""

    def __init__(self) -> None:
        self.bus_ok = False
        self.keys: TtlCache[KeyView | None] = TtlCache(load_key, self._ttl, is_miss=_is_none)
        # Unknown names are cached too; `model` is at most 256 characters (MODEL_MAX_CHARS), so this bounds it to ~10 MB.
        self.targets: TtlCache[RuleView | str] = TtlCache(load_rule, self._ttl, max_entries=20_000,
                                                          is_miss=_is_not_found)
        self.fleet_reader = FleetReader()
        self._fleet: TtlCache[FleetView] = TtlCache(self._load_fleet, self._fleet_ttl)

    def _load_fleet(self) -> FleetView:
        """The fleet view, from a full read or only the rows that changed (``inference.gateway.fleet_reader``)."""
        return self.fleet_reader.load()

    def _ttl(self) -> tuple[float, float]:
        if self.bus_ok:
            hard = settings.QUIVER_GATEWAY_CACHE_TTL_S
            return hard / 2, hard
        fallback = settings.QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S
        return fallback / 2, fallback

    @staticmethod
    def _fleet_ttl() -> tuple[float, float]:
        refresh = settings.QUIVER_GATEWAY_FLEET_REFRESH_S
        return refresh, max(5.0, 10 * refresh)

    async def fleet(self) -> FleetView:
        """The fleet view (stale by at most the refresh interval, except right after a long idle)."""
        return await self._fleet.get()

    async def fleet_fresh(self, max_age_s: float) -> FleetView:
        """The fleet view read at most ``max_age_s`` ago (waits for a reload otherwise; concurrent callers share it)."""
        view = await self._fleet.get()
        if time.monotonic() - view.read_at <= max_age_s:
            return view
        return await self._fleet._load(())

    def fleet_seen(self) -> FleetView | None:
        """The fleet view last read, without waiting (None before the first read or right after an invalidation)."""
        return self._fleet.peek()

    def invalidate(self, kind: str, ident: Any = None) -> None:
        """Apply one invalidation message: ``key`` (key_id), ``tenant`` (tenant id: its keys and targets),
        ``targets`` (tenant id, or None for every tenant), ``fleet`` (the next request waits for a fresh read),
        ``placements`` (a fresh read starts now, in the background), or ``all``."""
        if kind == "key":
            self.keys.invalidate(lambda k: k[0] == ident)
        elif kind == "tenant":
            self.keys.invalidate(lambda k: True)
            self.targets.invalidate(lambda k: k[0] == ident)
        elif kind == "targets":
            self.targets.invalidate(None if ident is None else (lambda k: k[0] == ident))
        elif kind == "fleet":
            self._fleet.invalidate()  # the next read (of what changed) is as fresh as a full one
        elif kind == "placements":
            # A placement stopped serving (an eviction; a heartbeat dropped a copy): read what changed now rather
            # than at the next refresh, still routing by the current view meanwhile (fleet_scale's propagation_ms).
            self._fleet.refresh()
        else:
            self.keys.invalidate()
            self.targets.invalidate()
            self.fleet_reader.reset()
            self._fleet.invalidate()
