"""The node agent's operations: stage + load, unload, pin, the eviction policy and the state report.

``NodeAgent`` composes the parts, each in its own module: staging and the disk budget (``staging``), the engine's
add/swap and tier reads (``engine_control``), eviction from the engine's CPU cache (``eviction``), the effect probe
(``effect_probe``) and the state report (``state_report``). It owns what they share: one lock per served name, and
what it learned from its own loads (errored loads, effect verdicts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference.node.cache import AdapterCache, CacheError, FileSpec
from inference.node.config import NodeSettings
from inference.node.effect_probe import EffectProbe
from inference.node.engine_client import EngineError, EngineHTTPClient
from inference.node.engine_control import add_lora_swapping, engine_tier
from inference.node.eviction import Evictor
from inference.node.staging import enforce_disk_budget, stage_files
from inference.node.state_report import state_report
from inference.policy.eviction import EvictionConfig, EvictionPolicy

logger = logging.getLogger(__name__)
# A load refused as asked (an unsafe name or file, a name or id the engine already serves otherwise) is not a failed
# load of an adapter: recording it reported an entry the control plane refuses ("not a served name", an id "listed
# twice"), so every later heartbeat of the node was refused and it left routing until its agent restarted (attack
# round, December 2026).
REFUSALS = frozenset({"invalid_request", "lora_name_conflict", "lora_int_id_conflict"})


class AgentError(Exception):
    """An error answer: `{"detail", "code"}` with `status`."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class LoadResult:
    """What `POST /v1/adapters/load` answers.

    Attributes:
        lora_name: served name.
        lora_int_id: engine id (AdapterVersion pk).
        pinned: whether the engine pins it now.
        download_ms: staging time in ms (verification of reused files included).
        load_ms: engine `add_lora` (+ `pin_lora`) time in ms.
        tier: where the engine holds it right after the load (`hot` = GPU slot, `warm` = CPU cache), read from
            the engine's own lists (vLLM's `add_lora` activates into a GPU slot, so usually `hot`).
        effect: the effect probe's verdict (`EffectProbe.probe`): `changed`, `no_effect`, `unknown` (the
            probe failed) or `unchecked` (probe off).
        evicted: names the agent dropped from the engine's CPU cache to make room (its eviction policy's choice);
            they stay served by name, and their next request reloads them from disk.
    """

    lora_name: str
    lora_int_id: int
    pinned: bool
    download_ms: float
    load_ms: float
    tier: str = "warm"
    effect: str = "unchecked"
    evicted: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The contract's response body."""
        return {
            "lora_name": self.lora_name,
            "lora_int_id": self.lora_int_id,
            "tier": self.tier,
            "pinned": self.pinned,
            "download_ms": round(self.download_ms, 3),
            "load_ms": round(self.load_ms, 3),
            "effect": self.effect,
            "evicted": list(self.evicted),
        }


class NodeAgent:
    """Coordinates the disk cache and the engine for one node.

    Args:
        settings: node settings.
        cache: the adapter cache (blocking; run in threads here).
        engine: HTTP client for the engine.
    """

    def __init__(self, settings: NodeSettings, cache: AdapterCache, engine: EngineHTTPClient) -> None:
        self.settings = settings
        self.cache = cache
        self.engine = engine
        # One in-flight operation per lora_name: concurrent loads of one adapter must not race on disk.
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # lora_name -> (lora_int_id, error code) of its last failed load here; cleared by a good load or unload.
        self.errored: dict[str, tuple[int, str]] = {}
        # lora_name -> (lora_int_id, effect probe verdict) of its last good load here.
        self.effects: dict[str, tuple[int, str]] = {}
        # Making room and adding happen one at a time: two loads must not pick each other's adapters as victims.
        self._room = asyncio.Lock()
        self.evictor = Evictor(settings, engine, busy=self._busy)
        self.effect_probe = EffectProbe(settings, engine)

    def _busy(self, lora_name: str) -> bool:
        """Whether a load, unload or pin of ``lora_name`` is in progress here."""
        return lora_name in self._locks and self._locks[lora_name].locked()

    def note_plan(self, answer: dict[str, Any]) -> None:
        """Keep a heartbeat answer's plan hint for eviction (``Evictor.note_plan``)."""
        self.evictor.note_plan(answer)

    async def load(
        self, lora_name: str, lora_int_id: int, files: Sequence[FileSpec], *, pin: bool, expect_effect: bool = True
    ) -> LoadResult:
        """Stage the files, make room by this node's eviction policy, `add_lora` with `lora_int_id` (and
        `pin_lora` if asked), then probe that the adapter changes the output.

        Idempotent: an adapter already served under the same id answers 200 again. If `lora_name` is
        served under another id (a new AdapterVersion behind the same name), the old one is removed
        from the engine first, then the new one is added. When the engine's CPU cache is full, the agent removes
        the adapter ``choose_victims`` picks (``QUIVER_EVICTION_POLICY``) before vLLM's LRU would pick one.

        Args:
            expect_effect: False when validation already warned the adapter is untrained; a `no_effect` probe
                then only shows in the answer and the state report instead of failing the load.

        Raises:
            AgentError: `invalid_request` 400; `s3_object_missing` 404; `s3_error` 502;
                `sha256_mismatch`/`size_mismatch` 422; `engine_load_failed` 422; `no_effect` 422 (the adapter
                changed nothing; it was removed again); `lora_int_id_conflict` 409; `pin_failed` 409;
                `all_pinned` 409 (the CPU cache holds only pins); `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            on_disk = await asyncio.to_thread(self.cache.staged)
            other = next((e.lora_name for e in on_disk if e.lora_int_id == lora_int_id and e.lora_name != lora_name),
                         None)
            if other is not None:  # before any download: a second folder with this id would be reported twice
                await self._drop_stale_copy(other, lora_int_id)
            try:
                staged = await stage_files(self.cache, lora_name, lora_int_id, files)
            except CacheError as exc:
                if exc.code not in REFUSALS:
                    self.errored[lora_name] = (lora_int_id, exc.code)
                raise AgentError(exc.status, exc.code, exc.detail) from exc
            started = time.perf_counter()
            try:
                async with self._room:
                    evicted = await self.evictor.make_room(lora_int_id)
                    result = await add_lora_swapping(self.engine, lora_name, lora_int_id, str(staged.path), pin=pin)
            except EngineError as exc:
                if exc.code in REFUSALS:  # the engine serves this name or id otherwise: keep no copy beside it
                    await asyncio.to_thread(self.cache.remove, lora_name, lora_int_id)
                elif exc.code != "engine_unavailable":
                    self.errored[lora_name] = (lora_int_id, exc.code)
                raise AgentError(exc.status, exc.code, exc.detail) from exc
            load_ms = (time.perf_counter() - started) * 1000.0
            effect = await self.effect_probe.verdict(lora_name, files)
            if effect == "no_effect" and expect_effect:
                with contextlib.suppress(EngineError):
                    await self.engine.remove_lora(lora_name)
                self.errored[lora_name] = (lora_int_id, "no_effect")
                self.effects.pop(lora_name, None)
                logger.warning("agent.no_effect", extra={"lora_name": lora_name, "lora_int_id": lora_int_id})
                raise AgentError(422, "no_effect", f"'{lora_name}' changes nothing: greedy output and logprobs on a "
                                 "fixed prompt equal the base model's, so it would serve as the base model")
            self.errored.pop(lora_name, None)
            self.effects[lora_name] = (lora_int_id, effect)
            added_at = time.monotonic()
            tier, requests = await engine_tier(self.engine, lora_int_id)
            self.evictor.note_loaded(lora_int_id, at=added_at, requests=requests)
        await enforce_disk_budget(self.cache, self.engine, self._locks, {(lora_name, lora_int_id)},
                                  forget=self._forget_effect)
        logger.info(
            "agent.loaded",
            extra={
                "lora_name": lora_name,
                "lora_int_id": lora_int_id,
                "pinned": result["pinned"],
                "download_ms": round(staged.download_ms, 1),
                "load_ms": round(load_ms, 1),
            },
        )
        return LoadResult(lora_name, lora_int_id, bool(result["pinned"]), staged.download_ms, load_ms, tier=tier,
                          effect=effect, evicted=evicted)

    async def _drop_stale_copy(self, other: str, lora_int_id: int) -> None:
        """``lora_int_id`` is staged here as ``other``: refuse (409 ``lora_int_id_conflict``) while the engine serves
        it under that name or a load of ``other`` runs; otherwise the copy is stale (left by an earlier control plane
        whose ids meant other versions: a fleet_scale rerun over the same node disks failed every such load) and is
        deleted so the load goes on."""
        try:
            served = {(e.get("lora_name"), e.get("lora_int_id")) for e in await self.engine.list_loras()}
        except EngineError as exc:
            raise AgentError(exc.status, exc.code, exc.detail) from exc
        if (other, lora_int_id) in served or self._busy(other):
            raise AgentError(409, "lora_int_id_conflict", f"lora_int_id {lora_int_id} is already used by "
                             f"'{other}' on this node")
        await asyncio.to_thread(self.cache.remove, other, lora_int_id)
        logger.warning("agent.stale_copy_removed", extra={"lora_name": other, "lora_int_id": lora_int_id})

    def _forget_effect(self, lora_name: str) -> None:
        self.effects.pop(lora_name, None)

    async def unload(self, lora_name: str, *, purge: bool = False) -> dict[str, Any]:
        """`remove_lora` from the engine; staged files stay on disk unless `purge` (the adapter was deleted).

        Idempotent: an adapter that is not served but is staged answers 200 too.

        Returns:
            `{"lora_name", "tier"}`: tier `staged`, or `cold` after a purge.

        Raises:
            AgentError: `lora_not_found` 404 (neither served nor staged); `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            try:
                await self.engine.remove_lora(lora_name)
            except EngineError as exc:
                if exc.code != "lora_not_found":
                    raise AgentError(exc.status, exc.code, exc.detail) from exc
                staged = await asyncio.to_thread(self.cache.staged)
                if not any(e.lora_name == lora_name for e in staged):
                    raise AgentError(
                        404, "lora_not_found", f"'{lora_name}' is neither loaded nor staged"
                    ) from exc
            self.errored.pop(lora_name, None)
            self.effects.pop(lora_name, None)
            if purge:
                await asyncio.to_thread(self.cache.remove, lora_name)
        logger.info("agent.unloaded", extra={"lora_name": lora_name, "purge": purge})
        return {"lora_name": lora_name, "tier": "cold" if purge else "staged"}

    async def pin(self, lora_name: str) -> dict[str, Any]:
        """`pin_lora` a served adapter.

        Raises:
            AgentError: `lora_not_found` 404; `pin_failed` 409; `engine_unavailable` 503.
        """
        async with self._locks[lora_name]:
            try:
                result = await self.engine.pin_lora(lora_name)
            except EngineError as exc:
                raise AgentError(exc.status, exc.code, exc.detail) from exc
        logger.info("agent.pinned", extra={"lora_name": lora_name})
        lora_int_id = result.get("lora_int_id")
        return {
            "lora_name": lora_name,
            "lora_int_id": lora_int_id,
            "tier": (await engine_tier(self.engine, int(lora_int_id)))[0] if lora_int_id else "warm",
            "pinned": True,
        }

    async def set_eviction_policy(self, policy: str) -> dict[str, str]:
        """Rank this node's victims by ``policy`` from now on, here and in the engine's workers (until the agent
        restarts: then ``QUIVER_EVICTION_POLICY`` again). The counts the policies rank by are kept.

        Raises:
            AgentError: 400 `invalid_policy`; the engine's error (503 `worker_extension_missing`, unreachable).
        """
        try:
            config = EvictionConfig(policy=EvictionPolicy(policy), half_life_s=self.evictor.config.half_life_s)
        except ValueError as exc:
            raise AgentError(400, "invalid_policy",
                             f"policy must be one of {', '.join(p.value for p in EvictionPolicy)}") from exc
        try:
            await self.evictor.set_policy(config)
        except EngineError as exc:
            raise AgentError(exc.status, exc.code, exc.detail) from exc
        logger.info("agent.eviction_policy", extra={"policy": config.policy.value})
        return {"policy": config.policy.value}

    async def state(self) -> dict[str, Any]:
        """The `GET /v1/state` report, also the heartbeat body (``state_report.state_report``); syncs the engine's
        eviction policy with the agent's on the way."""
        return await state_report(self.settings, self.engine, self.cache, errored=self.errored,
                                  effects=self.effects, on_engine_residency=self.evictor.sync_engine_policy)
