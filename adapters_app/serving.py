"""Serving rules: which version(s) ``model = "<adapter>"`` reaches, and every change of it (docs/versions.md).

A rule is ``[[number, weight], ...]`` on :class:`~adapters_app.models.Adapter` (weights sum to 100, checked by the
pure :func:`inference.policy.versions.rule_check`). A new adapter's first ready version takes traffic on its own;
later versions become ready without traffic unless the upload asked (``on_ready``) or the adapter auto-promotes.
Promote, canary and rollback warm the versions that join the rule first (the fleet's warm path, through
``adapters_app.signals.FleetPort.version_warm``) and switch after, so their first requests find the adapter loaded;
each change is one :class:`~adapters_app.models.ServingChange` row (who, when, before → after), and saving the
adapter tells every gateway process within the invalidation bus's delay (``inference.gateway.signals``). A version
that leaves the rule is not unloaded: its in-flight requests finish, ``name@N`` still reaches it, and the engines'
LRUs and the reconciler reclaim its slots once nothing asks for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters_app.models import Adapter, AdapterVersion, ServingChange
from adapters_app.signals import fleet_port
from common.exceptions import QuiverError
from inference.policy.versions import RuleInvalid, canary_rule, rule_check
from tenants.models import Tenant

logger = logging.getLogger(__name__)
WARM_POLL_S = 0.25
SYSTEM_ACTOR = "system"


@dataclass
class ServingResult:
    """The outcome of a rule change: the adapter (saved), whether the rule changed, each joining version's warm
    state (``"warm"``: resident on a live node before the switch; ``"cold"``: no node could load it within
    ``QUIVER_PROMOTE_WARM_WAIT_S``, so its first requests wait for the load; ``"no_node"``: no live node serves its
    base model), and when the rule now in force began to serve (for an unchanged rule, its last change; None when
    the rule was never changed)."""

    adapter: Adapter
    changed: bool
    warm: dict[int, str] = field(default_factory=dict)
    serving_since: datetime | None = None


def rule_pairs(raw: Any) -> list[tuple[int, int]]:
    """A stored rule as ``[(number, weight), ...]`` (malformed entries dropped)."""
    out: list[tuple[int, int]] = []
    for entry in raw or []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and all(isinstance(x, int) for x in entry):
            out.append((int(entry[0]), int(entry[1])))
    return out


def effective_rule(adapter: Adapter) -> list[tuple[int, int]]:
    """The rule the gateway applies (``inference.gateway.directory.load_rule``): the stored rule's ready versions
    with a weight, else the adapter's first ready version alone; empty before any version is ready."""
    ready = _ready_numbers(adapter)
    rule = [(v, w) for v, w in rule_pairs(adapter.serving_rule) if v in ready and w > 0]
    return rule or ([(min(ready), 100)] if ready else [])


def _stored(rule: Sequence[tuple[int, int]]) -> list[list[int]]:
    return [[int(v), int(w)] for v, w in rule]


def _ready_numbers(adapter: Adapter) -> set[int]:
    return set(AdapterVersion.objects.filter(adapter=adapter, status=AdapterVersion.Status.READY)
               .values_list("number", flat=True))


def _invalid(exc: RuleInvalid) -> QuiverError:
    fields = {exc.field: [str(exc)]} if exc.field else None
    return QuiverError(str(exc), code="serving_rule_invalid", status_code=400, fields=fields)


def _versions_exist(adapter: Adapter, numbers: Sequence[int]) -> None:
    """Refuse a rule naming a version the adapter never had, or one that is not ready, saying which.

    ``rule_check`` only knows the ready numbers, so ``promote {"version": 7}`` on a two-version adapter used to
    read "Version 7 is not ready", as if v7 were on its way (a fresh user's finding).

    Raises:
        QuiverError: 400 ``serving_rule_invalid`` with ``fields.version``.
    """
    status = dict(AdapterVersion.objects.filter(adapter=adapter).values_list("number", "status"))
    for number in numbers:
        if number not in status:
            have = ", ".join(f"v{n} ({status[n]})" for n in sorted(status)) or "none yet"
            message = (f"Adapter '{adapter.name}' has no version {number}; its versions: {have} "
                       f"(GET /api/v1/adapters/{adapter.name}/versions lists them).")
        elif status[number] != AdapterVersion.Status.READY:
            message = f"Version {number} is {status[number]}, not ready; only ready versions can take traffic."
        else:
            continue
        raise QuiverError(message, code="serving_rule_invalid", status_code=400, fields={"version": [message]})


def _warm_first(adapter: Adapter, numbers: Sequence[int]) -> dict[int, str]:
    """Ask the fleet to warm each version and wait (bounded by ``QUIVER_PROMOTE_WARM_WAIT_S``) until each is
    resident on a live node; returns each number's state (see :class:`ServingResult`)."""
    ids = dict(AdapterVersion.objects.filter(adapter=adapter, number__in=list(numbers)).values_list("number", "pk"))
    state = {n: "cold" for n in numbers}
    pending = set(numbers)
    deadline = time.monotonic() + settings.QUIVER_PROMOTE_WARM_WAIT_S
    port = fleet_port()
    while pending:
        for number in sorted(pending):
            answer = port.version_warm(ids[number])
            if answer in ("warm", "no_node"):
                state[number] = answer
                pending.discard(number)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(WARM_POLL_S)
    return state


def _apply(tenant: Tenant, adapter: Adapter, *, rule: Sequence[tuple[int, int]], action: str, actor: str,
           previous: Sequence[tuple[int, int]] | None = None, expect: list[list[int]] | None = None) -> bool:
    """Write ``rule`` under the adapter's row lock, keeping the rule it replaces for rollback and an audit row.

    ``expect``: the rule the caller saw; a concurrent change in between makes this a 409 (the caller decided on a
    rule that no longer stands). Returns False when the rule is already in place.

    Raises:
        QuiverError: 409 ``serving_rule_changed``.
    """
    with transaction.atomic():
        locked = Adapter.objects.select_for_update().get(pk=adapter.pk, tenant=tenant)
        before = locked.serving_rule or []
        if expect is not None and before != expect:
            raise QuiverError("The serving rule changed meanwhile; read it again and retry.",
                              code="serving_rule_changed", status_code=409)
        after = _stored(rule)
        if before == after:
            adapter.serving_rule, adapter.previous_rule = locked.serving_rule, locked.previous_rule
            return False
        locked.serving_rule = after
        locked.previous_rule = _stored(previous) if previous is not None else before
        locked.save(update_fields=["serving_rule", "previous_rule"])
        ServingChange.objects.create(tenant=tenant, adapter=locked, actor=actor[:200], action=action,
                                     before=before, after=after)
    adapter.serving_rule, adapter.previous_rule = locked.serving_rule, locked.previous_rule
    logger.info("adapter.serving_rule_changed", extra={"adapter_id": adapter.pk, "action": action, "actor": actor,
                                                       "before": before, "after": after})
    return True


def serving_rule_set(tenant: Tenant, *, adapter: Adapter, rule: Sequence[tuple[int, int]], action: str, actor: str,
                     warm: bool = True, previous: Sequence[tuple[int, int]] | None = None) -> ServingResult:
    """Make ``rule`` the adapter's serving rule, warming first the versions that join it or whose share grows.

    Args:
        rule: ``(number, weight)`` pairs; every number ready, weights summing to 100.
        action: the audit trail's word (``promote``, ``canary``, ``rollback``, …).
        actor: who asked (a username, ``key:<key_id>``, or ``system``).
        warm: warm those versions before the switch (bounded wait; see :class:`ServingResult`).
        previous: what a rollback returns to afterwards (default: the rule being replaced).

    Raises:
        QuiverError: 400 ``serving_rule_invalid`` (the message names the fix; a version the adapter does not have
            or that is not ready names the adapter's versions or its status), 409 ``serving_rule_changed``.
    """
    _versions_exist(adapter, [v for v, w in rule if w > 0])
    try:
        canonical = rule_check(rule, ready=_ready_numbers(adapter))
    except RuleInvalid as exc:
        raise _invalid(exc) from exc
    seen = list(adapter.serving_rule or [])
    # A version whose share grows is warmed too: a 10 % canary promoted to 100 % may have been pushed to disk meanwhile
    # (a fresh user's finding: promote answered "warm": {} and the version took all traffic from disk).
    had = dict(rule_pairs(seen))
    joining = [v for v, weight in canonical if weight > had.get(v, 0)]
    states = _warm_first(adapter, joining) if warm and joining else {}
    changed = _apply(tenant, adapter, rule=canonical, action=action, actor=actor, previous=previous, expect=seen)
    # Unchanged (a repeated promote): the rule in force began with its last change (null was read as "not serving").
    since = timezone.now() if changed else ServingChange.objects.filter(adapter=adapter).exclude(
        action="settings").order_by("-created_at", "-pk").values_list("created_at", flat=True).first()
    return ServingResult(adapter=adapter, changed=changed, warm=states, serving_since=since)


def serving_promote(tenant: Tenant, *, adapter: Adapter, number: int, actor: str) -> ServingResult:
    """Send all of ``model = "<adapter>"``'s traffic to version ``number`` (warmed first).

    Raises:
        QuiverError: 400 ``serving_rule_invalid`` (not a ready version), 409 ``serving_rule_changed``.
    """
    return serving_rule_set(tenant, adapter=adapter, rule=[(number, 100)], action="promote", actor=actor)


def serving_canary(tenant: Tenant, *, adapter: Adapter, number: int, percent: int, actor: str) -> ServingResult:
    """Send ``percent`` % to version ``number`` and the rest to the current rule's heaviest other version
    (:func:`inference.policy.versions.canary_rule`; 0 drops the canary, 100 promotes).

    Raises:
        QuiverError: 400 ``serving_rule_invalid`` (also: ``number`` is not a ready version, serves alone, or is the
            heaviest version of the rule; ``fields.version`` names the fix), 409 ``serving_rule_changed``.
    """
    _versions_exist(adapter, [number])
    try:
        rule = canary_rule(effective_rule(adapter), version=number, percent=percent)
    except RuleInvalid as exc:
        raise _invalid(exc) from exc
    return serving_rule_set(tenant, adapter=adapter, rule=rule, action="canary", actor=actor)


def serving_split(tenant: Tenant, *, adapter: Adapter, rule: Sequence[tuple[int, int]], actor: str) -> ServingResult:
    """Set a whole weighted split (e.g. ``[(3, 90), (4, 10)]``), warming the versions that join it first.

    Raises:
        QuiverError: 400 ``serving_rule_invalid``, 409 ``serving_rule_changed``.
    """
    return serving_rule_set(tenant, adapter=adapter, rule=rule, action="canary", actor=actor)


def serving_rollback(tenant: Tenant, *, adapter: Adapter, actor: str) -> ServingResult:
    """Return to the rule before the last change, in one call (a second rollback undoes the first). Versions that
    rejoin were serving a moment ago, so nothing waits for a warm: rollback is the emergency path.

    Raises:
        QuiverError: 409 ``nothing_to_roll_back`` (no earlier rule), 400 ``serving_rule_invalid`` (a version of the
            earlier rule is no longer ready), 409 ``serving_rule_changed``.
    """
    previous = rule_pairs(adapter.previous_rule)
    if not previous:
        raise QuiverError(f"Adapter '{adapter.name}' has no earlier serving rule to return to.",
                          code="nothing_to_roll_back", status_code=409)
    return serving_rule_set(tenant, adapter=adapter, rule=previous, action="rollback", actor=actor, warm=False,
                            previous=rule_pairs(adapter.serving_rule))


def serving_settings_set(tenant: Tenant, *, adapter: Adapter, changes: dict[str, Any], actor: str) -> Adapter:
    """Set ``auto_promote``, ``rpm_limit`` or ``tpm_limit`` (null = unlimited) on the adapter; audited as
    ``settings``. Saving tells the gateways (the adapter's targets are re-read). Values equal to the stored ones
    are no change: no save and no ``ServingChange`` row (a row whose before equals its after only buries the real
    changes)."""
    allowed = {"auto_promote", "rpm_limit", "tpm_limit"}
    fields = [k for k in changes if k in allowed]
    if not fields:
        return adapter
    with transaction.atomic():
        locked = Adapter.objects.select_for_update().get(pk=adapter.pk, tenant=tenant)
        fields = [k for k in fields if getattr(locked, k) != changes[k]]
        if not fields:
            return locked
        before = {k: getattr(locked, k) for k in fields}
        for k in fields:
            setattr(locked, k, changes[k])
        locked.save(update_fields=fields)
        ServingChange.objects.create(tenant=tenant, adapter=locked, actor=actor[:200], action="settings",
                                     before=[before], after=[{k: changes[k] for k in fields}])
    return locked


def serving_on_ready(version: AdapterVersion) -> ServingResult | None:
    """A version just became ready: the adapter's first ready version takes all traffic; a later one takes traffic
    only when its upload asked (``on_ready``: ``{"promote": true}`` or ``{"canary": pct}``) or the adapter
    auto-promotes, after a warm like any promotion. Otherwise the rule stays (None). Idempotent (a redelivered
    validation finds the rule already in place)."""
    adapter = Adapter.objects.get(pk=version.adapter_id)
    tenant = Tenant.objects.get(pk=adapter.tenant_id)
    ready = _ready_numbers(adapter)
    if not [v for v, w in rule_pairs(adapter.serving_rule) if v in ready and w > 0]:
        # No rule yet: the first ready version (what the gateway already serves) becomes it.
        first = serving_rule_set(tenant, adapter=adapter, rule=[(min(ready), 100)], action="first_ready",
                                 actor=SYSTEM_ACTOR, warm=False)
        if min(ready) == version.number:
            return first
    current = rule_pairs(adapter.serving_rule)
    asked = version.on_ready or {}
    if asked.get("promote") or adapter.auto_promote:
        action = "upload_promote" if asked.get("promote") else "auto_promote"
        return serving_rule_set(tenant, adapter=adapter, rule=[(version.number, 100)], action=action,
                                actor=SYSTEM_ACTOR)
    percent = asked.get("canary")
    if isinstance(percent, int) and 0 < percent <= 100:
        try:
            rule = canary_rule(current, version=version.number, percent=percent)
        except RuleInvalid:
            # A redelivery after the version was promoted meanwhile: it is the primary now, so nothing to canary.
            return None
        return serving_rule_set(tenant, adapter=adapter, rule=rule, action="upload_canary", actor=SYSTEM_ACTOR)
    return None


def actor_name(*, user: Any = None, api_key: Any = None) -> str:
    """The audit trail's name for a caller: the username, else ``key:<key_id>``."""
    if user is not None:
        return str(user.get_username())
    if api_key is not None:
        return f"key:{api_key.key_id}"
    return SYSTEM_ACTOR
