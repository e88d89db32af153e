"""Operator actions on the fleet's desired state (pins, replicas, tenant residency quotas, evict now).

Each action writes the operator's intent (``VersionIntent``, ``TenantResidencyQuota``; never touched by heartbeats),
one ``FleetAuditRecord`` (who, what, target, before → after) and, where the engine must act now, enqueues the existing
warm/evict tasks on commit. Rules: at most ``max_loras − 1`` pins per node (``inference.policy.eviction.check_pin``),
a tenant's ``max_pinned`` quota. Both bounds hold under concurrent pins: a pin locks the tenant's quota row, then the
node rows it pins on (in primary-key order), before it counts (``node_pins``); the reconciler takes the same node
lock before it carries a pin to a node (``node_pin_room``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet

from adapters_app.models import AdapterVersion
from inference.fleet.models import (
    RESIDENT,
    FleetAuditRecord,
    Node,
    Placement,
    TenantResidencyQuota,
    VersionIntent,
)
from inference.fleet.node_client import NodeCallFailed
from inference.fleet.nodes import nodes_live
from inference.fleet.warming import placement_evict
from inference.policy.eviction import PinLimitError, check_pin, pin_allowed
from tenants.models import Tenant
from workers import schedule
from workers.enqueue import enqueue_on_commit

TIERS = [t.value for t in Placement.Tier]


class FleetActionError(Exception):
    """A refused action: HTTP ``status``, stable ``code``, and a ``detail`` naming the fix."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _intent_json(intent: VersionIntent) -> dict[str, Any]:
    return {"min_replicas": intent.min_replicas, "max_replicas": intent.max_replicas,
            "pinned_fleet": intent.pinned_fleet, "pinned_nodes": list(intent.pinned_nodes)}


def _audit(actor: str, action: str, target: str, before: dict[str, Any], after: dict[str, Any]) -> FleetAuditRecord:
    return FleetAuditRecord.objects.create(actor=actor, action=action, target=target, before=before, after=after)


def _audit_change(actor: str, action: str, target: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Record a setting's change, and nothing when it changed nothing: saving a form with the same values wrote rows
    whose before equalled their after, which bury the real changes in the log (a fresh user's finding)."""
    if before != after:
        _audit(actor, action, target, before, after)


def _target(version: AdapterVersion) -> str:
    return f"{version.adapter.tenant.slug}/{version.adapter.name}@{version.number}"


def version_intent_get(version: AdapterVersion) -> VersionIntent:
    """The version's desired state (created with defaults on first use)."""
    intent, _ = VersionIntent.objects.get_or_create(adapter_version=version)
    return intent


def _pin_nodes(version: AdapterVersion, node: Node | None) -> list[Node]:
    if node is not None:
        return [node]
    held = Placement.objects.filter(Q(tier__in=RESIDENT) | Q(served=True), adapter_version=version,
                                    node__in=nodes_live(version.adapter.base_model)).select_related("node")
    return [p.node for p in held]


def node_pins(node: Node) -> set[int]:
    """The versions pinned on ``node`` or about to be: rows marked pinned (a pin marks its row before its warm runs,
    and heartbeats keep the mark while an operator's intent pins the version there: ``nodes.node_heartbeat``) and
    operators' pins naming the node. Count it with the node's row locked (``Node.objects.select_for_update()``),
    as ``version_pin`` and the reconciler do, so that two pins cannot both see room for one."""
    pinned = set(Placement.objects.filter(node=node, pinned=True).values_list("adapter_version_id", flat=True))
    for version_id, names in VersionIntent.objects.exclude(pinned_nodes=[]).values_list("adapter_version_id",
                                                                                         "pinned_nodes"):
        if node.name in names:
            pinned.add(version_id)
    return pinned


def node_pin_room(node: Node, version_id: int) -> bool:
    """Whether the reconciler may carry ``version_id``'s pin to ``node``: its row there is pinned already (the bound
    was checked when that happened), or one more pin beside the node's others (``node_pins``) leaves an unpinned
    slot (``pin_allowed``). Call inside a transaction; it locks the node's row until that transaction ends."""
    locked = Node.objects.select_for_update().get(pk=node.pk)
    if Placement.objects.filter(node=locked, adapter_version_id=version_id, pinned=True).exists():
        return True
    return pin_allowed(len(node_pins(locked) - {version_id}), locked.max_loras)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _pin_quota_message(version: AdapterVersion, max_pinned: int, pinned: QuerySet[VersionIntent]) -> str:
    """The ``residency_quota_exceeded`` sentence: the tenant, its quota (plural right), what it pins now (the first
    five by name) and both fixes. It was "tenant may pin 1 versions; unpin one or raise the quota", which named
    neither the tenant nor the pins (a fresh user's finding)."""
    slug = version.adapter.tenant.slug
    rows = list(pinned.select_related("adapter_version__adapter__tenant").order_by("adapter_version_id"))
    names = [_target(row.adapter_version) for row in rows[:5]] + ([f"{len(rows) - 5} more"] if len(rows) > 5 else [])
    now = f"already pins {len(rows)} ({', '.join(names)})" if rows else "pins none now"
    return (f"Tenant '{slug}' may pin {_plural(max_pinned, 'version')} and {now}, so {_target(version)} cannot be "
            f"pinned too: unpin one of them, or raise the tenant's max_pinned (PUT "
            f"/api/v1/operator/residency-quotas/{slug}).")


def version_pin(version: AdapterVersion, *, node: Node | None, actor: str) -> VersionIntent:
    """Pin ``version`` on ``node`` (or on every live node holding it when None) and have the agents pin it now.

    Concurrent pins are serialised on the tenant's quota row and the nodes' rows (see the module docstring), so
    neither bound can be passed by a race.

    Raises:
        FleetActionError: 409 ``pin_limit`` (the node already has ``max_loras − 1`` pins), 409
            ``residency_quota_exceeded`` (the tenant's ``max_pinned``), 409 ``not_resident`` (fleet pin, held nowhere).
    """
    with transaction.atomic():
        # Lock order, everywhere: quota row, then node rows by pk, then the intent.
        quota = TenantResidencyQuota.objects.select_for_update().filter(tenant=version.tenant).first()
        nodes = _pin_nodes(version, node)
        if not nodes:
            raise FleetActionError(409, "not_resident", "No live node holds this version; pin it on a named node.")
        nodes = list(Node.objects.select_for_update().filter(pk__in=[n.pk for n in nodes]).order_by("pk"))
        intent = VersionIntent.objects.select_for_update().get(pk=version_intent_get(version).pk)
        before = _intent_json(intent)
        # The tenant's own quota first: it names the fix the tenant's operator can make.
        if quota is not None and quota.max_pinned is not None:
            pinning = VersionIntent.objects.filter(adapter_version__tenant=version.tenant).exclude(
                adapter_version=version).filter(Q(pinned_fleet=True) | ~Q(pinned_nodes=[]))
            if pinning.count() + 1 > quota.max_pinned:
                raise FleetActionError(409, "residency_quota_exceeded", _pin_quota_message(version, quota.max_pinned,
                                                                                           pinning))
        for n in nodes:
            pinned = len(node_pins(n) - {version.pk})
            try:
                check_pin(pinned, n.max_loras)
            except PinLimitError as exc:
                raise FleetActionError(409, "pin_limit", f"node {n.name}: {exc}") from exc
        if node is None:
            intent.pinned_fleet = True
        else:
            intent.pinned_nodes = sorted({*intent.pinned_nodes, node.name})
        intent.save()
        _audit_change(actor, "pin", _target(version), before, _intent_json(intent))
        for n in nodes:
            placement, _ = Placement.objects.get_or_create(node=n, adapter_version=version)
            Placement.objects.filter(pk=placement.pk).update(pinned=True)
            enqueue_on_commit(schedule.PLACEMENT_WARM, placement.pk)
    return intent


def version_unpin(version: AdapterVersion, *, node: Node | None, actor: str) -> VersionIntent:
    """Drop the pin on ``node`` (or everywhere). vLLM has no unpin: the engine copy is removed (``remove_lora``
    frees its pin) and the next request reloads it unpinned."""
    with transaction.atomic():
        intent = VersionIntent.objects.select_for_update().get(pk=version_intent_get(version).pk)
        before = _intent_json(intent)
        if node is None:
            intent.pinned_fleet, intent.pinned_nodes = False, []
        else:
            intent.pinned_nodes = [n for n in intent.pinned_nodes if n != node.name]
        intent.save()
        _audit_change(actor, "unpin", _target(version), before, _intent_json(intent))
        pinned = Placement.objects.filter(adapter_version=version, pinned=True)
        if node is not None:
            pinned = pinned.filter(node=node)
        for placement_id in list(pinned.values_list("pk", flat=True)):
            enqueue_on_commit(schedule.PLACEMENT_EVICT, placement_id)
    return intent


def placement_evict_now(placement: Placement, *, actor: str) -> FleetAuditRecord:
    """Remove the version from that node's engine now (its disk copy stays; the next request reloads it).

    The audit row is written at once with ``after.outcome`` ``pending`` (no assumed state); the task fills in what
    happened once the node answered (``placement_evict_audited``).

    Returns:
        The audit row.

    Raises:
        FleetActionError: 409 ``pinned`` (unpin first).
    """
    if placement.pinned:
        raise FleetActionError(409, "pinned", "This placement is pinned; unpin it first.")
    before = {"node": placement.node.name, "tier": placement.tier}
    record = _audit(actor, "evict", _target(placement.adapter_version), before, {"outcome": "pending"})
    enqueue_on_commit(schedule.PLACEMENT_EVICT, placement.pk, record.pk)
    return record


def placement_evict_audited(placement_id: int, *, audit_id: int) -> Placement | None:
    """Carry out an operator's evict (``placement_evict_now``) and write its outcome into that action's audit row:
    ``after`` becomes the row as the node left it (``node``, ``tier``, ``served``) with ``outcome`` ``evicted``, or
    ``outcome`` ``failed`` with the node's ``error`` code and ``detail``, or ``outcome`` ``gone`` when the
    placement was deleted meanwhile.

    Returns:
        The placement after the evict, or None when it is gone.

    Raises:
        NodeCallFailed: the agent refused or could not be reached (recorded first).
    """
    audit = FleetAuditRecord.objects.filter(pk=audit_id)
    placement = Placement.objects.select_related("node", "adapter_version__adapter__tenant").filter(
        pk=placement_id).first()
    if placement is None:
        audit.update(after={"outcome": "gone"})
        return None
    try:
        placement_evict(placement)
    except NodeCallFailed as exc:
        audit.update(after={"node": placement.node.name, "tier": placement.tier, "outcome": "failed",
                            "error": exc.code, "detail": exc.detail[:500]})
        raise
    placement.refresh_from_db(fields=["tier", "served", "pinned"])
    audit.update(after={"node": placement.node.name, "tier": placement.tier, "served": placement.served,
                        "outcome": "evicted"})
    return placement


def version_replicas_set(version: AdapterVersion, *, min_replicas: int, max_replicas: int | None,
                         actor: str) -> VersionIntent:
    """Set the version's replica bounds (``inference.policy.placement`` reads them as ``Demand.min/max_replicas``).

    Raises:
        FleetActionError: 400 ``invalid_replicas`` (``min_replicas`` < 1 or ``max_replicas`` < ``min_replicas``).
    """
    if min_replicas < 1 or (max_replicas is not None and max_replicas < min_replicas):
        raise FleetActionError(400, "invalid_replicas", "need 1 ≤ min_replicas ≤ max_replicas (or max_replicas null)")
    with transaction.atomic():
        intent = VersionIntent.objects.select_for_update().get(pk=version_intent_get(version).pk)
        before = _intent_json(intent)
        intent.min_replicas, intent.max_replicas = min_replicas, max_replicas
        intent.save()
        _audit_change(actor, "set_replicas", _target(version), before, _intent_json(intent))
    return intent


def tenant_residency_quota_set(tenant: Tenant, *, max_pinned: int | None, max_gpu_bytes: int | None,
                               actor: str) -> TenantResidencyQuota:
    """Set a tenant's residency quota (null = no limit)."""
    with transaction.atomic():
        quota, _ = TenantResidencyQuota.objects.select_for_update().get_or_create(tenant=tenant)
        before = {"max_pinned": quota.max_pinned, "max_gpu_bytes": quota.max_gpu_bytes}
        quota.max_pinned, quota.max_gpu_bytes = max_pinned, max_gpu_bytes
        quota.save()
        _audit_change(actor, "set_residency_quota", tenant.slug, before,
               {"max_pinned": max_pinned, "max_gpu_bytes": max_gpu_bytes})
    return quota


def tenant_residency(tenant: Tenant, *, adapter_names: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Per version of the tenant's adapters (only those named in ``adapter_names`` when given: a key limited to
    some adapters learns nothing of the others): how many replicas sit in each tier and how many are pinned.

    Returns:
        ``[{"adapter", "version", "tiers": {tier: count}, "pinned": int}]`` — never node names or addresses.
    """
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    scoped = Placement.objects.filter(adapter_version__tenant=tenant)
    if adapter_names is not None:
        scoped = scoped.filter(adapter_version__adapter__name__in=list(adapter_names))
    placements = scoped.values_list("adapter_version__adapter__name", "adapter_version__number", "tier", "pinned")
    for adapter, number, tier, pinned in placements:
        row = rows.setdefault((adapter, number), {"adapter": adapter, "version": number,
                                                  "tiers": Counter({t: 0 for t in TIERS}), "pinned": 0})
        row["tiers"][tier] += 1
        row["pinned"] += int(pinned)
    return [{**row, "tiers": dict(row["tiers"])} for _, row in sorted(rows.items())]


def tenant_limits_set(tenant: Tenant, *, limits: dict[str, int | None], actor: str) -> Tenant:
    """Set a tenant's gateway limits (``rpm_limit``, ``tpm_limit``, ``concurrency_limit``, ``max_tokens_limit``;
    None = unlimited) through ``tenants.services.limits_set`` and record the change in the fleet audit log. Every
    gateway process applies them within a second (cache invalidation, ``inference.gateway.signals``).

    Raises:
        django.core.exceptions.ValidationError: an unknown field or a value below 1, naming the field.
    """
    from tenants.models import LIMIT_FIELDS
    from tenants.services import limits_set

    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        before = {name: getattr(locked, name) for name in LIMIT_FIELDS}
        limits_set(locked, limits=limits)
        _audit_change(actor, "set_limits", locked.slug, before, {name: getattr(locked, name) for name in LIMIT_FIELDS})
    return locked
