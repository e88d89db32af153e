"""Writes for tenants, memberships and API keys (conventions §1: services call full_clean() then save())."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from common.echo import clip
from tenants.models import LIMIT_FIELDS, PRIORITY_CLASSES, ApiKey, Membership, Tenant
from tenants.scopes import ALL_SCOPES, INFERENCE, KEYS_MANAGE


class ApiKeyInvalid(Exception):
    """The presented key is malformed, unknown, revoked, disabled or expired. ``reason`` says which (for logs)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def tenant_create(*, slug: str, name: str, max_adapters: int = 100) -> Tenant:
    """Create a tenant.

    Raises:
        django.core.exceptions.ValidationError: bad or duplicate ``slug``.
    """
    tenant = Tenant(slug=slug, name=name, max_adapters=max_adapters)
    tenant.full_clean()
    tenant.save()
    return tenant


def membership_create(tenant: Tenant, *, user: User, role: str = Membership.Role.MEMBER) -> Membership:
    """Give ``user`` a ``role`` (owner/member/viewer) in ``tenant``.

    Raises:
        django.core.exceptions.ValidationError: unknown role or an existing membership.
    """
    membership = Membership(tenant=tenant, user=user, role=role)
    membership.full_clean()
    membership.save()
    return membership


def _digest(secret: str) -> str:
    return hmac.new(settings.QUIVER_API_KEY_HMAC_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()


def api_key_create(
    tenant: Tenant,
    *,
    name: str,
    scopes: Sequence[str] = ALL_SCOPES,
    expires_at: datetime | None = None,
    actor: User | None = None,
    granted_by: ApiKey | None = None,
    grantable: Collection[str] | None = None,
    limits: Mapping[str, Any] | None = None,
    adapters: Sequence[str] = (),
) -> tuple[ApiKey, str]:
    """Mint an API key for ``tenant``.

    ``adapters`` scopes the key at the gateway to those models (adapter names, or ``name@N`` for one version; empty
    = every model of the tenant); a key minted by a scoped key is scoped at least as narrowly (its parent's list
    when none is given).

    The key starts with ``limits`` (gateway limits by field, as :func:`limits_set` takes them; what an owner set for
    the minting member: :func:`member_key_limits`) and, per field, never looser than the granting key's own, so
    neither a member nor a limited key escapes its limits by minting a fresh key.

    Returns:
        ``(key, plaintext)``; ``plaintext`` is ``<prefix>_<key_id>.<secret>`` and is never stored or shown again.

    Raises:
        django.core.exceptions.ValidationError: unknown scope (field ``scopes``), a scope the granting key lacks (a key
            cannot mint a stronger key) or outside ``grantable`` (what the creating user's role may grant), an
            expiry in the past, or one later than the granting key's own (``expires_at``: a key cannot mint a key
            that outlives it; without ``expires_at`` the new key inherits the granting key's expiry).
        common.exceptions.QuiverError: 403 ``quota_exceeded`` when the tenant has ``max_api_keys`` active keys.
    """
    unknown = sorted(set(scopes) - set(ALL_SCOPES))
    if unknown:
        raise ValidationError({"scopes": f"Unknown scope(s) {clip(unknown)}; allowed: {list(ALL_SCOPES)}."})
    if granted_by is not None and not set(scopes) <= set(granted_by.scopes):
        extra = sorted(set(scopes) - set(granted_by.scopes))
        raise ValidationError({"scopes": f"This key cannot grant {extra}; ask for at most {sorted(granted_by.scopes)}."})
    adapters = sorted(set(adapters))
    parent = {str(a) for a in (granted_by.adapters if granted_by is not None else None) or []}
    if parent:
        wider = [a for a in adapters if a not in parent and a.partition("@")[0] not in parent]
        if wider:
            raise ValidationError({"adapters": f"This key may only call {sorted(parent)}; it cannot grant {wider}."})
        adapters = adapters or sorted(parent)
    if grantable is not None and not set(scopes) <= set(grantable):
        extra = sorted(set(scopes) - set(grantable))
        raise ValidationError({"scopes": f"Your role cannot grant {extra}; ask a tenant owner, or pick from "
                                         f"{sorted(grantable)}."})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "Expiry must be in the future."})
    if granted_by is not None and actor is None:
        actor = granted_by.created_by  # a key's keys belong to its creator, so removing them revokes the whole chain
    if granted_by is not None and granted_by.expires_at is not None:
        if expires_at is None:
            expires_at = granted_by.expires_at
        elif expires_at > granted_by.expires_at:
            raise ValidationError({"expires_at": f"This key expires at {granted_by.expires_at.isoformat()}; a key it "
                                                 "mints cannot outlive it. Pick an earlier expiry."})
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    from common.exceptions import QuiverError  # here: DRF imports this module while common.exceptions loads

    with transaction.atomic():
        # The tenant row lock makes count-then-insert race-free across concurrent requests.
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        active = ApiKey.objects.filter(tenant=tenant, enabled=True).count()
        if active >= locked.max_api_keys:
            raise QuiverError(f"Tenant quota of {locked.max_api_keys} active API keys reached; revoke one or ask an "
                              "operator to raise max_api_keys.", code="quota_exceeded", status_code=403)
        inherited = limits_tightest(dict(limits or {}), _limits_of(granted_by) if granted_by is not None else {})
        return _api_key_insert(tenant, key_id, secret, name, scopes, expires_at, actor, inherited, adapters)


def adapters_not_found(tenant: Tenant, adapters: Sequence[str]) -> list[str]:
    """The entries of a key's ``adapters`` (names, or ``name@N``) that name nothing of ``tenant`` yet: no adapter of
    that name, or, for ``name@N``, no version N of it. Sorted; ``[]`` when all exist.

    Not an error: a key may be scoped to an adapter before its first upload (a scoped key may create the adapters
    it names, ``TenantScopedViewSet.adapter_in_reach``), so the API answers with these beside the new key."""
    entries = {str(a) for a in adapters}
    names = {e.partition("@")[0] for e in entries}
    # Reverse relations of adapters_app's models: tenants sits below it and never imports it (pyproject layers).
    existing = set(tenant.adapters.filter(name__in=sorted(names)).values_list("name", flat=True))
    versions = set(tenant.adapter_versions.filter(adapter__name__in=sorted(existing))
                   .values_list("adapter__name", "number"))
    missing = []
    for entry in entries:
        name, _, number = entry.partition("@")
        if name not in existing or (number and (name, int(number)) not in versions):
            missing.append(entry)
    return sorted(missing)


def adapters_not_found_warning(missing: Sequence[str]) -> str | None:
    """The sentence the key's creator reads about :func:`adapters_not_found`'s ``missing`` entries; None when none."""
    if not missing:
        return None
    return (f"No adapter or version {', '.join(missing)} exists yet. The key can call them once they are uploaded "
            "under those names; if you meant existing adapters, check the spelling, revoke this key and create it "
            "again.")


def _limits_of(key: ApiKey) -> dict[str, Any]:
    return {name: getattr(key, name) for name in LIMIT_FIELDS if getattr(key, name) is not None}


def limits_tightest(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Per limit field, the stricter of two sets (None/absent = unlimited; a lower priority class is stricter)."""
    out: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        values = [v for v in (first.get(name), second.get(name)) if v is not None]
        if values and name == "priority_class":  # vLLM's priority: a higher number runs later
            out[name] = max(values, key=lambda c: PRIORITY_CLASSES.get(c, 0))
        elif values:
            out[name] = min(values)
    return out


def limits_loosened(holder: Any, limits: Mapping[str, Any]) -> str | None:
    """The first limit in ``limits`` that would let ``holder`` (a key, an adapter: anything with the limit fields
    as attributes) do more than now: a set limit cleared (None) or raised, or for ``priority_class`` a higher class
    (null ranks as ``normal``); None when every change tightens or keeps. Keys outside :data:`LIMIT_FIELDS` are
    not limits and are skipped. The one rule behind ``limit_owner_only``: whoever is not an owner may only tighten
    what an owner set, on keys (``tenants.views``) and adapters (``adapters_app.views``) alike."""
    for name, new in limits.items():
        if name not in LIMIT_FIELDS:
            continue
        old = getattr(holder, name)
        if name == "priority_class":
            if PRIORITY_CLASSES.get(new or "normal", 0) < PRIORITY_CLASSES.get(old or "normal", 0):
                return name
        elif old is not None and (new is None or new > old):
            return name
    return None


def _api_key_insert(tenant: Tenant, key_id: str, secret: str, name: str, scopes: Sequence[str],
                    expires_at: datetime | None, actor: User | None,
                    limits: Mapping[str, Any], adapters: Sequence[str] = ()) -> tuple[ApiKey, str]:
    key = ApiKey(
        tenant=tenant,
        key_id=key_id,
        digest=_digest(secret),
        name=name,
        scopes=sorted(set(scopes)),
        adapters=list(adapters),
        expires_at=expires_at,
        created_by=actor,
        **limits,
    )
    key.full_clean()
    key.save()
    return key, f"{settings.QUIVER_API_KEY_PREFIX}_{key_id}.{secret}"


PLAYGROUND_KEY_NAME = "console playground"
PLAYGROUND_KEY_TTL = timedelta(hours=1)


def playground_key_issue(tenant: Tenant, *, actor: User,
                         limits: Mapping[str, Any] | None = None) -> tuple[ApiKey, str]:
    """The console playground's ``inference`` key of ``actor`` in ``tenant``, with a fresh secret valid for an hour.

    One live row per user and tenant: the first call mints it (quota-checked, with ``limits`` as
    :func:`api_key_create` takes them); later calls replace its secret and expiry in place, so the old secret stops
    working and the tenant's key list never grows with visits. The secret is never stored (only its HMAC) and is
    returned this once; a key the user revoked stays revoked, and the next call mints a new row.

    Returns:
        ``(key, plaintext)``; ``plaintext`` is ``<prefix>_<key_id>.<secret>``, expiring ``PLAYGROUND_KEY_TTL`` from now.

    Raises:
        common.exceptions.QuiverError: 403 ``quota_exceeded`` when minting the first one finds the tenant's
            ``max_api_keys`` active keys.
    """
    expires_at = timezone.now() + PLAYGROUND_KEY_TTL
    with transaction.atomic():
        Tenant.objects.select_for_update().get(pk=tenant.pk)  # two tabs at once: one row, not two
        key = (ApiKey.objects.select_for_update()
               .filter(tenant=tenant, created_by=actor, console_playground=True, enabled=True).first())
        if key is None:
            key, plaintext = api_key_create(tenant, name=PLAYGROUND_KEY_NAME, scopes=[INFERENCE],
                                            expires_at=expires_at, actor=actor, limits=limits)
            key.console_playground = True
            key.save(update_fields=["console_playground"])
            return key, plaintext
        secret = secrets.token_urlsafe(32)
        key.digest, key.expires_at = _digest(secret), expires_at
        key.full_clean()
        key.save(update_fields=["digest", "expires_at"])  # post_save: gateways drop the cached old digest
    return key, f"{settings.QUIVER_API_KEY_PREFIX}_{key.key_id}.{secret}"


def api_key_revoke(tenant: Tenant, *, key_id: str, actor: User | None = None) -> ApiKey:
    """Disable a key for good. Idempotent.

    Raises:
        ApiKey.DoesNotExist: no such key in this tenant (another tenant's key is not found either).
    """
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(tenant=tenant, key_id=key_id)
        if key.enabled:
            key.enabled = False
            key.revoked_at = timezone.now()
            key.save(update_fields=["enabled", "revoked_at"])
    return key


def api_key_verify(raw: str) -> ApiKey:
    """Resolve a presented bearer token to an active key, touching ``last_used_at`` at most once a minute.

    Args:
        raw: the token as sent, ``<prefix>_<key_id>.<secret>``.

    Returns:
        The key, with ``tenant`` loaded.

    Raises:
        ApiKeyInvalid: malformed, unknown, disabled/revoked or expired key. Digests are compared with
            ``hmac.compare_digest`` (conventions §4).
    """
    prefix = f"{settings.QUIVER_API_KEY_PREFIX}_"
    if not raw.startswith(prefix) or "." not in raw:
        raise ApiKeyInvalid("malformed")
    key_id, _, secret = raw[len(prefix) :].partition(".")
    key = ApiKey.objects.select_related("tenant").filter(key_id=key_id).first()
    if key is None or not hmac.compare_digest(key.digest, _digest(secret)):
        raise ApiKeyInvalid("unknown")
    if not key.enabled:
        raise ApiKeyInvalid("revoked")
    now = timezone.now()
    if key.expires_at is not None and key.expires_at <= now:
        raise ApiKeyInvalid("expired")
    interval = timedelta(seconds=settings.QUIVER_API_KEY_LAST_USED_INTERVAL_S)
    if key.last_used_at is None or now - key.last_used_at >= interval:
        # Conditional update so concurrent requests write once per interval.
        ApiKey.objects.filter(pk=key.pk).exclude(last_used_at__gt=now - interval).update(last_used_at=now)
        key.last_used_at = now
    return key


# Scopes a role may hold on keys it created (tenants.views: members cannot grant keys:manage; viewers mint no keys).
ROLE_KEY_SCOPES = {
    Membership.Role.OWNER: frozenset(ALL_SCOPES),
    Membership.Role.MEMBER: frozenset(ALL_SCOPES) - {KEYS_MANAGE},
    Membership.Role.VIEWER: frozenset(),
}


def _revoke_keys_beyond(tenant: Tenant, *, user: User, allowed: frozenset[str]) -> int:
    """Revoke ``user``'s enabled keys in ``tenant`` holding any scope outside ``allowed``; returns how many."""
    keys = ApiKey.objects.filter(tenant=tenant, created_by=user, enabled=True)
    stale = [k.key_id for k in keys if not set(k.scopes) <= allowed]
    for key_id in stale:  # one by one through api_key_revoke, so whatever revocation triggers (caches) runs
        api_key_revoke(tenant, key_id=key_id)
    return len(stale)


def membership_set_role(tenant: Tenant, *, membership: Membership, role: str) -> Membership:
    """Change a member's role, keeping at least one owner.

    A demoted user's keys that hold scopes the new role could not grant are revoked (an owner made member loses
    ``keys:manage`` keys; a viewer keeps no key), so a demotion is not undone by a key minted before it.

    Raises:
        django.core.exceptions.ValidationError: unknown role, or demoting the tenant's last owner.
    """
    with transaction.atomic():
        _lock_owners(tenant)
        if membership.role == Membership.Role.OWNER and role != Membership.Role.OWNER:
            _ensure_other_owner(tenant, membership)
        membership.role = role
        membership.full_clean()
        membership.save(update_fields=["role"])
        _revoke_keys_beyond(tenant, user=membership.user, allowed=ROLE_KEY_SCOPES[Membership.Role(role)])
    return membership


def membership_delete(tenant: Tenant, *, membership: Membership) -> None:
    """Remove a member, keeping at least one owner, and revoke every key they created in the tenant.

    Raises:
        django.core.exceptions.ValidationError: removing the tenant's last owner.
    """
    with transaction.atomic():
        _lock_owners(tenant)
        if membership.role == Membership.Role.OWNER:
            _ensure_other_owner(tenant, membership)
        _revoke_keys_beyond(tenant, user=membership.user, allowed=frozenset())
        membership.delete()


def _lock_owners(tenant: Tenant) -> None:
    # Serialises concurrent demotions so two owners cannot demote each other at once.
    list(Membership.objects.select_for_update().filter(tenant=tenant, role=Membership.Role.OWNER))


def _ensure_other_owner(tenant: Tenant, membership: Membership) -> None:
    if not Membership.objects.filter(tenant=tenant, role=Membership.Role.OWNER).exclude(pk=membership.pk).exists():
        raise ValidationError({"role": "A tenant keeps at least one owner; make someone else owner first."})


def member_key_limits(tenant: Tenant, *, user: User) -> dict[str, Any]:
    """The limits every key ``user`` mints in ``tenant`` starts with (``Membership.key_limits``; {} for none)."""
    membership = Membership.objects.filter(tenant=tenant, user=user).only("key_limits").first()
    return dict(membership.key_limits) if membership is not None else {}


def member_key_limits_note(tenant: Tenant, *, key: ApiKey, limits: Mapping[str, Any]) -> None:
    """An owner set ``limits`` on ``key``: when a member who is not an owner created it, the values become, field by
    field, the limits that member's next keys start with (None clears a field). Owners' own keys bind no one."""
    if key.created_by_id is None:
        return
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(tenant=tenant, user_id=key.created_by_id).first()
        if membership is None or membership.role == Membership.Role.OWNER:
            return
        merged = {**membership.key_limits, **{k: v for k, v in limits.items() if k in LIMIT_FIELDS}}
        membership.key_limits = {k: v for k, v in merged.items() if v is not None}
        membership.save(update_fields=["key_limits"])


def limits_set(obj: Tenant | ApiKey, *, limits: Mapping[str, int | None]) -> Tenant | ApiKey:
    """Set gateway limits (``rpm_limit``, ``tpm_limit``, ``concurrency_limit``, ``max_tokens_limit``; None = unlimited)
    on a tenant or a key. Every gateway process applies them within a second (``inference.gateway.signals``).

    Raises:
        django.core.exceptions.ValidationError: an unknown field or a value below 1, naming the field.
    """
    unknown = sorted(set(limits) - set(LIMIT_FIELDS))
    if unknown:
        raise ValidationError({clip(unknown[0]): f"Unknown limit; allowed: {list(LIMIT_FIELDS)}."})
    for name, value in limits.items():
        setattr(obj, name, value)
    # Only the fields set: a row named under older rules (a slug with `--`) still takes its limits.
    obj.full_clean(exclude=[f.name for f in obj._meta.fields if f.name not in limits])
    obj.save(update_fields=list(limits))
    return obj
