"""Reads for the adapter registry, always scoped by tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from adapters_app.models import Adapter, AdapterVersion
from tenants.models import Tenant


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
