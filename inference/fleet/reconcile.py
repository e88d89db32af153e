"""The reconcile loop: converge what nodes report (``Placement``) toward what is wanted (``inference.policy.placement``
over live nodes, recent request rates and operators' ``VersionIntent``), through the existing warm tasks.

Idempotent and crash-safe: it reads only committed rows and asks for warms through ``placement_request_warm``, which
skips a version that is resident or already warming; running it twice, or after a control-plane restart, enqueues
nothing new for a converged fleet. It adds replicas and pins, the replicas only where they fit the nodes' CPU slots
hottest first (``inference.policy.placement.slotted``; a version past them loads on its next request), and it trims:
replicas above a version's ``max_replicas`` (the plan's nodes kept), then tenants over their ``max_gpu_bytes`` quota
lose their own GPU-resident adapters, least used first (``inference.policy.eviction.choose_victims``). Pins are never
trimmed (a row's ``pinned`` is an operator's pin; a node's report cannot set it). Node capacities are the
heartbeats' clamped to the operators' ceilings (``inference.policy.node_capacity``). Making room on a full node is
the agent's job (``QUIVER_EVICTION_POLICY`` on the node); an operator can evict now through the API.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from adapters_app.models import AdapterVersion, BaseModel
from adapters_app.selectors import adapter_versions_serving
from inference.fleet.models import RESIDENT, Node, Placement, TenantResidencyQuota, VersionIntent
from inference.fleet.nodes import nodes_live
from inference.fleet.plan import plan_all, plan_publish, warm_backoff_load, warm_backoff_save
from inference.fleet.services import node_pin_room
from inference.fleet.warming import placement_request_warm_enqueued
from inference.metering.models import UsageRecord
from inference.policy.backoff import (
    WarmBackoff,
    WarmBackoffConfig,
    warm_backoff_asked,
    warm_backoff_due,
    warm_backoff_loaded,
)
from inference.policy.eviction import Resident, choose_victims
from inference.policy.placement import Demand, PlacementConfig, PlacementNode, place, slotted
from workers import schedule
from workers.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)
RATE_WINDOW_S = 600
BACKOFF = WarmBackoffConfig()  # 30 s (one pass) doubling to 15 min per (version, node)


def fleet_reconcile(*, now: float | None = None) -> int:
    """One pass over every base model with live nodes; returns how many warms and evictions it enqueued (a warm
    ``placement_request_warm`` skipped, already in flight or resident, is not counted).

    Each (version, node) warm backs off while it keeps failing or being undone (``inference.policy.backoff``: 30 s
    doubling to 15 min, reset once the engine holds it); the states live beside the plan (``fleet_plan``).

    Args:
        now: the pass's time (epoch seconds) for the backoff; the wall clock by default (tests pass their own).
    """
    now = time.time() if now is None else now
    asked = skipped = 0
    backoff = warm_backoff_load()
    backoff_next: dict[tuple[int, str], WarmBackoff] = {}
    plans: dict[int, tuple[str, ...]] = {}
    # Only the fields a pass reads: with every field, its adapter's, its tenant's and its base model's (whole
    # config and facts, parsed again for each of 2,000 versions), building the rows was a third of a pass's CPU
    # (cProfile, scripts/bench_fleet_view). A warm reads one key of the validation report (the effect probe,
    # ``adapter_version_no_effect_refused``): PostgreSQL extracts it, since decoding every whole report was a
    # quarter of a 64-node pass (cProfile in fleet_scale: 4,084 JSON decodes).
    ready = (AdapterVersion.objects.filter(status=AdapterVersion.Status.READY)
             .select_related("adapter").order_by("adapter_id", "-number")
             .only("id", "tenant_id", "adapter_id", "number", "r", "size_bytes", "status",
                   "adapter__id", "adapter__tenant_id", "adapter__base_model_id", "adapter__serving_rule")
             .annotate(effect_probe=KeyTransform("effect_probe", "validation_report")))
    versions: dict[int, AdapterVersion] = {}
    for ready_version in ready:
        probe = ready_version.effect_probe
        ready_version.validation_report = {"effect_probe": probe} if probe else {}
        versions[ready_version.pk] = ready_version
    bases = BaseModel.objects.in_bulk({v.adapter.base_model_id for v in versions.values()})
    # The versions the gateway serves by adapter name: each adapter's serving rule (adapters_app.serving).
    newest = {v.pk: v for v in adapter_versions_serving(versions.values())}
    since = timezone.now() - timedelta(seconds=RATE_WINDOW_S)
    counts = dict(UsageRecord.objects.filter(created_at__gte=since, adapter_version__isnull=False)
                  .values_list("adapter_version").annotate(n=Count("id")).values_list("adapter_version", "n"))
    intents = {i.adapter_version_id: i for i in VersionIntent.objects.all()}
    # ``held``: the live nodes that answer for the version, in an engine or served by name from disk (tier
    # ``staged``, ``served``: the agent dropped it from the CPU cache, and a request there reloads it); where its
    # requests go, so the plan keeps it there and a fleet pin covers them. ``loaded``: those whose engine holds it
    # now (``hot``/``warm``); only these need no pre-warm.
    held: dict[int, set[str]] = defaultdict(set)
    loaded: dict[int, set[str]] = defaultdict(set)
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    for version_id, node_name, tier in Placement.objects.filter(
            Q(tier__in=RESIDENT) | Q(served=True), node__healthy=True, node__last_heartbeat_at__gte=fresh,
    ).values_list("adapter_version_id", "node__name", "tier"):  # a dead node's rows hold nothing
        held[version_id].add(node_name)
        if tier in RESIDENT:
            loaded[version_id].add(node_name)
    no_gpu_room = tenants_at_gpu_quota()
    previous = plan_all()  # the last pass's plan (Redis): placement's hysteresis; {} after a restart or without Redis
    by_base: dict[int, list[AdapterVersion]] = defaultdict(list)
    for v in newest.values():
        by_base[v.adapter.base_model_id].append(v)
    for base_id, base_versions in by_base.items():
        live = list(nodes_live(bases[base_id]))
        if not live:
            continue
        nodes = [PlacementNode(n.name, str(base_id), n.max_lora_rank, max(n.max_cpu_loras, 1), gpu_slots=n.max_loras)
                 for n in live]
        demands = []
        for v in base_versions:
            intent = intents.get(v.pk)
            pinned = frozenset(intent.pinned_nodes) if intent else frozenset()
            if intent and intent.pinned_fleet:
                pinned |= frozenset(held[v.pk])
            demands.append(Demand(v.pk, str(base_id), v.r or 0, v.size_bytes, counts.get(v.pk, 0) / RATE_WINDOW_S,
                                  min_replicas=intent.min_replicas if intent else 1,
                                  max_replicas=intent.max_replicas if intent else None,
                                  pinned_nodes=pinned, resident_on=frozenset(held[v.pk]),
                                  planned_on=frozenset(previous.get(v.pk, ()))))
        plan = place(demands, nodes, config=PlacementConfig(miss_cost=settings.QUIVER_PLACEMENT_MISS_COST,
                                                               replica_worth=settings.QUIVER_PLACEMENT_REPLICA_WORTH))
        plans.update(plan)
        fits = slotted(plan, demands, nodes)
        node_by_name = {n.name: n for n in live}
        for d in demands:
            for name in plan.get(d.version_id, ()):
                pair = (d.version_id, name)
                if pair in backoff:
                    backoff_next[pair] = backoff[pair]
                if name in loaded[d.version_id] and name not in d.pinned_nodes:
                    _backoff_settled(backoff_next, pair, now)
                    continue
                if name not in d.pinned_nodes and not _prewarm(d, name, plan, fits, loaded, intents):
                    continue
                repin = new_pin = False
                if name in d.pinned_nodes:
                    with transaction.atomic():
                        # The node's row lock bounds pins against concurrent operator pins (services.version_pin).
                        if not node_pin_room(node_by_name[name], d.version_id):
                            logger.warning("fleet.pin_over_bound", extra={"version_id": d.version_id, "node": name})
                            continue
                        row, _ = Placement.objects.get_or_create(node=node_by_name[name],
                                                                 adapter_version=versions[d.version_id])
                        # An operator's new pin goes out on this pass, whatever backoff an earlier warm left.
                        new_pin = not row.pinned
                        Placement.objects.filter(node=node_by_name[name], adapter_version_id=d.version_id).update(
                            pinned=True)
                    if name in loaded[d.version_id]:
                        if _engine_pinned(node_by_name[name], d.version_id):
                            _backoff_settled(backoff_next, pair, now)
                            continue
                        repin = True  # loaded, but the engine holds no pin (it restarted, or the pin failed)
                elif versions[d.version_id].tenant_id in no_gpu_room:
                    continue  # a load lands in a GPU slot; this tenant has none left (its requests still load it)
                if not new_pin and not warm_backoff_due(backoff_next.get(pair), now=now, config=BACKOFF):
                    skipped += 1  # its last warms failed or were undone: asked again after its backoff
                    continue
                _, enqueued = placement_request_warm_enqueued(versions[d.version_id], node=node_by_name[name],
                                                              even_if_served=True, repin=repin)
                if enqueued:  # a warm in flight, a resident row or a no_effect refusal enqueues nothing
                    asked += 1
                    backoff_next[pair] = warm_backoff_asked(backoff_next.get(pair), now=now)
    plan_publish(plans)
    warm_backoff_save(backoff_next)
    evicted = fleet_trim(plans=plans, intents=intents, counts=counts)
    logger.info("fleet.reconciled", extra={"warms": asked, "evictions": evicted, "warms_backed_off": skipped})
    return asked + evicted


def _backoff_settled(states: dict[tuple[int, str], WarmBackoff], pair: tuple[int, str], now: float) -> None:
    """The engine holds ``pair`` as wanted: reset its backoff once it has held long enough (``warm_backoff_loaded``)."""
    state = warm_backoff_loaded(states.get(pair), now=now, config=BACKOFF)
    if state is None:
        states.pop(pair, None)
    else:
        states[pair] = state


def _engine_pinned(node: Node, version_id: int) -> bool:
    """Whether the node's last heartbeat (its engine's own report, ``Node.state``) says ``version_id`` is pinned;
    the placement row's ``pinned`` is the operator's pin, so it cannot tell. Only asked for a version an operator
    pinned on the node: a node that lies here only goes without its repin."""
    return any(a.get("lora_int_id") == version_id and a.get("pinned") for a in (node.state or {}).get("adapters", []))


def _prewarm(d: Demand, name: str, plan: dict[int, tuple[str, ...]], fits: frozenset[tuple[int, str]],
             loaded: dict[int, set[str]], intents: dict[int, VersionIntent]) -> bool:
    """Whether to load unpinned ``d`` onto ``name`` ahead of its requests: a replica of a replicated version, or the
    only one of a version an operator set replicas for (an intent off the defaults: a row that a read or a pin
    created does not count) that no live node's engine holds (``loaded``: a copy served from disk is not held); in
    both cases within the node's CPU slots (``slotted``). Anything else loads on its next request: a version past
    the slots would evict a hotter one, and pre-warming single replicas on noisy rates cost ~20 engine loads per
    1,000 requests in the simulator's acceptance case (122 → 142)."""
    if (d.version_id, name) not in fits:
        return False
    intent = intents.get(d.version_id)
    floor = intent is not None and (intent.min_replicas > 1 or intent.max_replicas is not None)
    return len(plan.get(d.version_id, ())) >= 2 or (floor and not loaded[d.version_id])


# The node's rank-padded GPU slot in bytes, read in SQL once per node: the whole stored heartbeat per placement row
# (10,000 adapters: ~1 MB, for every resident or served row of the node) made this a quadratic parse every pass,
# and extracting it in SQL per placement row still detoasted the node's report once per row (2,700 rows at 64
# nodes: most of the trim's time in a fleet_scale profile).
_SLOT_BYTES = KeyTransform("gpu_slot_bytes", KeyTransform("residency", "state"))


def _hot_bytes(slot_bytes: Any) -> int:
    return slot_bytes if isinstance(slot_bytes, int) and not isinstance(slot_bytes, bool) and slot_bytes > 0 else 0


def _slot_bytes_by_node(node_ids: set[int]) -> dict[int, int]:
    """Node id → its GPU slot in bytes from its last heartbeat (0 when it reported none)."""
    if not node_ids:
        return {}
    return {pk: _hot_bytes(b) for pk, b in Node.objects.filter(pk__in=node_ids).values_list("pk", _SLOT_BYTES)}


def tenants_at_gpu_quota() -> set[int]:
    """Tenants whose GPU-resident bytes already reach ``max_gpu_bytes``: the plan does not warm their versions."""
    quotas = dict(TenantResidencyQuota.objects.exclude(max_gpu_bytes=None).values_list("tenant_id", "max_gpu_bytes"))
    if not quotas:
        return set()
    rows = list(Placement.objects.filter(tier=Placement.Tier.HOT, adapter_version__tenant_id__in=quotas)
                .values_list("adapter_version__tenant_id", "node_id"))
    slot = _slot_bytes_by_node({node_id for _, node_id in rows})
    used: dict[int, int] = defaultdict(int)
    for tenant_id, node_id in rows:
        used[tenant_id] += slot.get(node_id, 0)
    return {t for t, limit in quotas.items() if limit is not None and used[t] >= limit}


def _evict(placement_ids: list[int]) -> None:
    with transaction.atomic():
        for placement_id in placement_ids:
            enqueue_on_commit(schedule.PLACEMENT_EVICT, placement_id)


def fleet_trim(*, plans: dict[int, tuple[str, ...]], intents: dict[int, VersionIntent],
               counts: dict[int, int]) -> int:
    """Evict what the desired state no longer allows; returns how many evictions it asked for.

    - replicas above ``VersionIntent.max_replicas``: the unpinned replicas off the plan go first. A replica is a
      live node that answers for the version: resident, or served by name from disk (a request there reloads it);
      a dead node's rows count for nothing and get no eviction (its agent cannot answer; its rows go cold when it
      comes back or is deregistered);
    - per tenant with ``TenantResidencyQuota.max_gpu_bytes``: GPU-resident (``hot``) bytes, each counted as its
      node's rank-padded slot (``residency.gpu_slot_bytes`` in the heartbeat; ``inference.policy.eviction``), above
      the quota are evicted from the tenant's own unpinned adapters, fewest recent requests first.
    """
    victims: list[int] = []
    fresh = timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
    live = Placement.objects.filter(node__healthy=True, node__last_heartbeat_at__gte=fresh,
                                    node__deregistered_at=None)
    rows = list(live.filter(Q(tier__in=RESIDENT) | Q(served=True), pinned=False)
                .values_list("pk", "adapter_version_id", "node__name", "tier", "node_id", "adapter_version__tenant_id"))
    slot = _slot_bytes_by_node({node_id for *_, node_id, _ in rows})
    resident = [(pk, version_id, node_name, tier, slot.get(node_id, 0), owner)
                for pk, version_id, node_name, tier, node_id, owner in rows]
    by_version: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for pk, version_id, node_name, _, _, _ in resident:
        by_version[version_id].append((pk, node_name))
    for version_id, intent in intents.items():
        if intent.max_replicas is None:
            continue  # before the count: a pass made one query per intent, most of which set no maximum
        held = by_version.get(version_id, [])
        pinned = live.filter(adapter_version_id=version_id, pinned=True).count()
        if len(held) + pinned <= intent.max_replicas:
            continue
        planned = plans.get(version_id, ())
        held.sort(key=lambda item, planned=planned: (item[1] in planned, item[1]))  # type: ignore[misc]
        victims.extend(pk for pk, _ in held[:len(held) + pinned - intent.max_replicas])
    quotas = {q.tenant_id: q.max_gpu_bytes for q in TenantResidencyQuota.objects.exclude(max_gpu_bytes=None)}
    for tenant_id, max_gpu_bytes in quotas.items():
        hot = [(pk, version_id, node_name, slot_bytes)  # slot_bytes: already _hot_bytes (_slot_bytes_by_node)
               for pk, version_id, node_name, tier, slot_bytes, owner in resident
               if owner == tenant_id and tier == Placement.Tier.HOT and pk not in victims]
        used = sum(size for *_, size in hot)
        if max_gpu_bytes is None or used <= max_gpu_bytes:
            continue
        residents = [Resident(version_id=pk, tenant_id=tenant_id, size_bytes=size, hits=float(counts.get(v, 0)),
                              desired=node_name in plans.get(v, ()), tenant_over_quota=True)
                     for pk, v, node_name, size in hot]
        # The placement's pk stands in for the version id: the same pure choice the node makes for a full tier.
        victims.extend(choose_victims(residents, slots=len(residents) + 1, budget_bytes=max_gpu_bytes,
                                      incoming_bytes=0, now_s=0.0))
    _evict(victims)
    if victims:
        logger.info("fleet.trimmed", extra={"placements": victims})
    return len(victims)
