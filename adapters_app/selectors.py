"""Reads for the adapter registry, always scoped by tenant."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from adapters_app.models import Adapter, AdapterVersion, ServingChange
from tenants.models import ApiKey, Tenant


def adapter_get(tenant: Tenant, *, name: str) -> Adapter | None:
    """The tenant's adapter called ``name``, or None (another tenant's adapter is None too)."""
    return Adapter.objects.select_related("base_model", "tenant").filter(tenant=tenant, name=name).first()


def adapter_list_servable(tenant: Tenant) -> QuerySet[Adapter]:
    """The tenant's adapters that have at least one ``ready`` version."""
    return (
        Adapter.objects.select_related("base_model")
        .filter(tenant=tenant, versions__status=AdapterVersion.Status.READY)
        .distinct()
        .order_by("name")
    )


def adapter_residency(adapter_ids: list[int]) -> dict[int, dict[str, int]]:
    """Replicas per tier for each adapter id, over all its versions: ``{adapter_id: {"hot": 1, "staged": 2}}``.

    Answered by the fleet (``adapters_app.signals.FleetPort.residency``): counts of placements, so a tenant learns
    how served an adapter is, not where.
    """
    from adapters_app.signals import fleet_port

    return fleet_port().residency(adapter_ids)


def adapter_version_untrained(version: AdapterVersion) -> bool:
    """True when validation warned ``adapter_untrained`` (every lora_B is zero): a no-effect probe is expected."""
    report = version.validation_report or {}
    return any(p.get("code") == "adapter_untrained" for p in report.get("problems", []))


def adapter_version_no_effect_refused(version: AdapterVersion) -> bool:
    """True when a node's effect probe found the version changes nothing and it is not served (see
    ``adapters_app.services.adapter_version_effect_record``)."""
    probe = (version.validation_report or {}).get("effect_probe") or {}
    return probe.get("verdict") == "no_effect" and not probe.get("served", False)


def adapter_versions_serving(ready: Iterable[AdapterVersion]) -> list[AdapterVersion]:
    """Of ``ready`` versions (with ``adapter`` loaded), those that ``model = "<adapter>"`` reaches: the versions in
    their adapter's serving rule with a positive weight, or an adapter's first ready version while its rule names
    none that is ready (``adapters_app.serving``)."""
    by_adapter: dict[int, list[AdapterVersion]] = {}
    for v in ready:
        by_adapter.setdefault(v.adapter_id, []).append(v)
    out: list[AdapterVersion] = []
    for versions in by_adapter.values():
        rule = {entry[0] for entry in (versions[0].adapter.serving_rule or [])
                if isinstance(entry, list) and len(entry) == 2 and entry[1] > 0}
        chosen = [v for v in versions if v.number in rule]
        out += chosen or [min(versions, key=lambda v: v.number)]
    return out


def _entries(rule: object) -> list[dict[str, int]]:
    return [{"version": e[0], "weight": e[1]} for e in (rule or []) if isinstance(e, list) and len(e) == 2]  # type: ignore[attr-defined]


def _key_names(tenant_id: int, actors: Iterable[str]) -> dict[str, str]:
    """``{"key:<key_id>": name}`` for the actors that are keys of this tenant (one query; the audit stores the key's
    id, which people do not recognise, and the name is looked up when read so a renamed key reads as it is now)."""
    key_ids = {actor.removeprefix("key:") for actor in actors if actor.startswith("key:")}
    if not key_ids:
        return {}
    rows = ApiKey.objects.filter(tenant_id=tenant_id, key_id__in=key_ids).values_list("key_id", "name")
    return {f"key:{key_id}": name for key_id, name in rows}


def serving_state(adapter: Adapter, *, history: int = 20) -> dict[str, object]:
    """An adapter's serving state for the API: ``rule`` (what the gateway applies: the stored rule's ready versions,
    else the first ready version) and ``previous_rule`` as ``[{version, weight}]``, settings
    (``auto_promote``, ``rpm_limit``, ``tpm_limit``) and its latest ``history`` changes, newest first, each with
    ``key_name``: the name of the tenant's key that acted (actor ``key:<key_id>``; null for a user, ``system`` or a
    key no longer stored)."""
    changes = list(ServingChange.objects.filter(adapter=adapter).order_by("-created_at", "-pk")[:history])
    key_names = _key_names(adapter.tenant_id, [c.actor for c in changes])
    ready = set(AdapterVersion.objects.filter(adapter=adapter, status=AdapterVersion.Status.READY)
                .values_list("number", flat=True))
    rule = [e for e in _entries(adapter.serving_rule) if e["version"] in ready and e["weight"] > 0]
    return {
        "adapter": adapter.name,
        "rule": rule or ([{"version": min(ready), "weight": 100}] if ready else []),
        "previous_rule": _entries(adapter.previous_rule) if adapter.previous_rule is not None else None,
        "auto_promote": adapter.auto_promote,
        "rpm_limit": adapter.rpm_limit,
        "tpm_limit": adapter.tpm_limit,
        "history": [{"actor": c.actor, "key_name": key_names.get(c.actor), "action": c.action, "before": c.before,
                     "after": c.after, "created_at": c.created_at} for c in changes],
    }
