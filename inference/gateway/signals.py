"""Publish cache invalidations for the gateway when keys, tenants, adapters or versions change.

Receivers run on ``post_save``/``post_delete`` (a revoke, a limit edit, a deleted adapter, a new ready version)
and publish after the transaction commits, so no gateway process reloads a row before it is visible. Nodes and
placements need no message: every process re-reads the fleet each ``QUIVER_GATEWAY_FLEET_REFRESH_S``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from inference.gateway.bus import invalidation_publish


def _publish_on_commit(kind: str, ident: Any) -> None:
    transaction.on_commit(partial(invalidation_publish, kind, ident))


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
