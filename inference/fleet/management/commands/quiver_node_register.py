"""``manage.py quiver_node_register <name> --agent-url URL --engine-url URL --base-model NAME [--rotate]``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from inference.fleet.nodes import NodeRefused, node_register


class Command(BaseCommand):
    help = ("Register an inference node with the URLs the control plane uses to reach its agent and engine, and "
            "print the node's credentials as env lines for the node (QUIVER_NODE_KEY, QUIVER_NODE_TOKEN).")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--agent-url", required=True)
        parser.add_argument("--engine-url", required=True)
        parser.add_argument("--base-model", required=True)
        parser.add_argument("--rotate", action="store_true", help="issue new credentials; the old ones stop working")

    def handle(self, *args: Any, name: str, agent_url: str, engine_url: str, base_model: str, rotate: bool,
               **options: Any) -> None:
        try:
            node, creds = node_register(name=name, agent_url=agent_url, engine_url=engine_url,
                                        base_model_name=base_model, rotate=rotate)
        except NodeRefused as exc:
            raise CommandError(exc.detail) from exc
        self.stderr.write(f"registered node {node.name} (key generation {node.key_generation}); give these to the "
                          "node only (VLLM_API_KEY = QUIVER_NODE_KEY on its engine):")
        self.stdout.write(f"QUIVER_NODE_NAME={node.name}\nQUIVER_NODE_KEY={creds.key}\nQUIVER_NODE_TOKEN={creds.token}")
