"""``manage.py quiver_node_wait <name> [--timeout SECONDS]``: wait until a registered node is live."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from inference.fleet.models import Node
from inference.fleet.nodes import nodes_live

POLL_S = 0.5


class Command(BaseCommand):
    help = ("Wait until the registered node NAME is live as the gateway counts it (healthy, a heartbeat within "
            "QUIVER_NODE_STALE_AFTER_S, a base model), then print one line and exit 0; exit 1 naming what is missing "
            "after --timeout seconds. Reads the database only: no tenant key, and no request is metered to anyone.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300; 0: look once)")

    def handle(self, *args: Any, name: str, timeout: float, **options: Any) -> None:
        if timeout < 0:
            raise CommandError(f"--timeout must be 0 or more seconds, not {timeout}.")
        deadline = time.monotonic() + timeout
        while True:
            node = Node.objects.select_related("base_model").filter(name=name, deregistered_at__isnull=True).first()
            if node is None:
                # Registration comes first (quiver_node_register); waiting cannot make an unknown name appear.
                raise CommandError(f"No registered node is named {name!r}; register it first with "
                                   "`manage.py quiver_node_register`.")
            if node.base_model is not None and nodes_live(node.base_model).filter(pk=node.pk).exists():
                self.stdout.write(f"node {name} is live (last heartbeat {node.last_heartbeat_at})")
                return
            if time.monotonic() >= deadline:
                raise CommandError(_why_not_live(node, timeout))
            time.sleep(POLL_S)


def _why_not_live(node: Node, timeout: float) -> str:
    """The timeout's message: what the node row lacks, and where to look."""
    if node.base_model is None:
        return (f"Node {node.name!r} has no base model (it was removed); re-register it with "
                "`manage.py quiver_node_register --base-model NAME`.")
    if node.last_heartbeat_at is None:
        seen = "has never sent a heartbeat"
    elif not node.healthy:
        seen = f"reported itself unhealthy at {node.last_heartbeat_at.isoformat()} (its engine is not answering)"
    else:
        seen = f"last sent a heartbeat at {node.last_heartbeat_at.isoformat()}, too long ago"
    return (f"Node {node.name!r} was not live after {timeout:.0f} s: it {seen}. Check its agent's log and that its "
            "QUIVER_CONTROL_URL reaches the control plane's internal listener; raise --timeout on a slow machine.")
