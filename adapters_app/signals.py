"""What the adapter registry tells other apps, and the two questions it asks the fleet, without importing it.

The registry sits below the fleet (``inference.gateway``) in the app layers (``.importlinter``): it never imports
the fleet. Events go out as Django signals, which the fleet connects to in its ``AppConfig.ready``:

- :data:`version_ready` (``version=AdapterVersion``): validation set a version ``ready``; the fleet places it.
- :data:`base_model_registered` (``base_model=BaseModel``): nodes already reporting that model can be linked.
- :data:`adapter_deleting` (``adapter=Adapter``), inside the delete's transaction and before the rows go: the fleet
  records a durable purge of every node copy (``adapters_app.purge.purge_node_copy``).

Questions the registry needs answered go through :class:`FleetPort`, which the fleet installs with
:func:`fleet_port_install`; until then (an app set without the fleet) residency is empty and node purges fail
and are retried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.dispatch import Signal

version_ready = Signal()
base_model_registered = Signal()
adapter_deleting = Signal()


class NodeCopyDropFailed(Exception):
    """The fleet could not make a node drop an adapter copy now (node unreachable, engine error); retry later."""


@dataclass(frozen=True)
class FleetPort:
    """The fleet's answers the registry needs.

    Attributes:
        residency: ``adapter_ids -> {adapter_id: {tier: replicas}}`` (tiers as the database names them), counts
            only, never node names (the tenant API shows them).
        node_copy_drop: ``(node_id, lora_name) -> None``; makes the node drop the copy from engine and disk; a
            node or copy that is already gone counts as done; raises :class:`NodeCopyDropFailed` otherwise.
        version_warm: ``version_id -> "warm" | "warming" | "no_node"``: whether the version is resident in a live
            node's engine now; when not, asks for a warm (a no-op while one is in flight) and answers ``warming``;
            ``no_node`` when no live node can load it (``adapters_app.serving`` waits on it before a promotion).
    """

    residency: Callable[[Sequence[int]], dict[int, dict[str, int]]]
    node_copy_drop: Callable[[int, str], None]
    version_warm: Callable[[int], str] = lambda version_id: "no_node"


def _no_residency(adapter_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    return {}


def _no_drop(node_id: int, lora_name: str) -> None:
    raise NodeCopyDropFailed("no fleet app is installed to reach nodes")


_port = FleetPort(residency=_no_residency, node_copy_drop=_no_drop)


def fleet_port_install(port: FleetPort) -> None:
    """Install the fleet's answers (called once from the fleet app's ``ready``)."""
    global _port
    _port = port


def fleet_port() -> FleetPort:
    """The installed :class:`FleetPort` (a placeholder that knows no nodes until the fleet installs its own)."""
    return _port
