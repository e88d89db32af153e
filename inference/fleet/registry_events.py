"""The fleet's side of the adapter registry's events and questions (``adapters_app.signals``).

The registry never imports the fleet (``.importlinter``); it sends signals and asks through a ``FleetPort``, and
this module answers, connected once from ``GatewayConfig.ready``:

- a version became ready → place it (:func:`inference.fleet.warming.placement_on_ready`);
- a base model was registered → link the nodes already heartbeating it;
- an adapter is being deleted → a durable purge for each node copy of its versions;
- residency counts for the tenant API, and dropping a node copy for a purge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count

from adapters_app.purge import purge_node_copy
from adapters_app.signals import (
    FleetPort,
    NodeCopyDropFailed,
    adapter_deleting,
    base_model_registered,
    fleet_port_install,
    version_ready,
)
from inference.fleet.models import Node, Placement


def _on_version_ready(sender: Any, version: Any, **kwargs: Any) -> None:
    from inference.fleet.warming import placement_on_ready

    placement_on_ready(version)


def _on_base_model_registered(sender: Any, base_model: Any, **kwargs: Any) -> None:
    Node.objects.filter(base_model__isnull=True, state__base_model=base_model.base_model_name).update(
        base_model=base_model)


def _on_adapter_deleting(sender: Any, adapter: Any, **kwargs: Any) -> None:
    copies = [(p.node_id, p.adapter_version.served_name)
              for p in Placement.objects.select_related("adapter_version__adapter__tenant").filter(
                  adapter_version__adapter=adapter)]
    for node_id, lora_name in copies:
        purge_node_copy(node_id, lora_name, reason="adapter_deleted")


def residency_counts(adapter_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Replicas per tier for each adapter id, over all its versions: ``{adapter_id: {"hot": 1, "staged": 2}}``.

    One query; counts placements (a version on a node), never names nodes.
    """
    rows = (Placement.objects.filter(adapter_version__adapter_id__in=list(adapter_ids))
            .values("adapter_version__adapter_id", "tier").annotate(n=Count("id")))
    out: dict[int, dict[str, int]] = {}
    for row in rows:
        out.setdefault(row["adapter_version__adapter_id"], {})[row["tier"]] = row["n"]
    return out


def node_copy_drop(node_id: int, lora_name: str) -> None:
    """Make node ``node_id`` drop ``lora_name`` from its engine and disk (``/v1/adapters/unload`` with ``purge``).

    A node row that is gone, or a copy the node no longer has (``lora_not_found``), counts as done.

    Raises:
        NodeCopyDropFailed: the node did not answer or refused; the purge is retried with backoff.
    """
    from inference.fleet.node_client import NodeCallFailed, node_call

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return
    try:
        node_call(node, "/v1/adapters/unload", {"lora_name": lora_name, "purge": True}, timeout=30)
    except NodeCallFailed as exc:
        if exc.code != "lora_not_found":
            raise NodeCopyDropFailed(str(exc)) from exc


def connect() -> None:
    """Connect the receivers and install the port (called once from ``GatewayConfig.ready``)."""
    version_ready.connect(_on_version_ready, dispatch_uid="fleet-version-ready")
    base_model_registered.connect(_on_base_model_registered, dispatch_uid="fleet-base-model-registered")
    adapter_deleting.connect(_on_adapter_deleting, dispatch_uid="fleet-adapter-deleting")
    from inference.fleet.warming import version_warm_state

    fleet_port_install(FleetPort(residency=residency_counts, node_copy_drop=node_copy_drop,
                                 version_warm=version_warm_state))
