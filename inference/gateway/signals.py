"""Publish cache invalidations for the gateway when keys, tenants, adapters or versions change.

Receivers run on ``post_save``/``post_delete`` (a revoke, a limit edit, a deleted adapter, a new ready version)
and publish after the transaction commits, so no gateway process reloads a row before it is visible. Placements
that stop serving are announced by the fleet itself (``placements``: an eviction, a heartbeat that dropped a copy);
otherwise every process re-reads what changed in the fleet each ``QUIVER_GATEWAY_FLEET_REFRESH_S``.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save

from common.bus import invalidation_publish_on_commit as _publish_on_commit


def _key_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _publish_on_commit("key", instance.key_id)


def _tenant_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _publish_on_commit("tenant", instance.pk)


def _adapter_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _publish_on_commit("targets", instance.tenant_id)


def _base_model_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _publish_on_commit("targets", None)


def connect() -> None:
    """Connect the receivers (called once from ``GatewayConfig.ready``)."""
    from adapters_app.models import Adapter, AdapterVersion, BaseModel
    from tenants.models import ApiKey, Tenant

    pairs = [(ApiKey, _key_changed), (Tenant, _tenant_changed), (Adapter, _adapter_changed),
             (AdapterVersion, _adapter_changed), (BaseModel, _base_model_changed)]
    for model, receiver in pairs:
        post_save.connect(receiver, sender=model, dispatch_uid=f"gateway-{model.__name__}-save")
        post_delete.connect(receiver, sender=model, dispatch_uid=f"gateway-{model.__name__}-delete")
