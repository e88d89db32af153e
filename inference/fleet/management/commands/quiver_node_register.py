"""``manage.py quiver_node_register <name> --agent-url URL --engine-url URL --base-model NAME [--rotate]
[--max-loras N] [--max-cpu-loras N] [--max-lora-rank N]``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from inference.fleet.nodes import NodeRefused, node_register
from inference.policy.node_capacity import CAPACITY_FIELDS, MAX_CEILING


def _ceiling(flag: str, text: str) -> int | None:
    """``text`` of ``flag`` as a ceiling: an integer in [1, 2**31 - 1], or ``default`` (None: the fleet's)."""
    if text.strip().lower() == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CEILING:
        raise CommandError(f"{flag} {text!r}: use an integer in [1, {MAX_CEILING}] (the engine's own setting of that "
                           "name, or less), or 'default' for the fleet's ceiling.")
    return value


class Command(BaseCommand):
    help = ("Register an inference node with the URLs the control plane uses to reach its agent and engine, and "
            "print the node's credentials as env lines for the node (QUIVER_NODE_KEY, QUIVER_NODE_TOKEN). "
            "--max-loras/--max-cpu-loras/--max-lora-rank cap what the node's heartbeats may claim (placement and "
            "routing use min(reported, ceiling)); omitted, a new node gets the fleet's ceilings "
            "(QUIVER_NODE_MAX_LORAS_CEILING, QUIVER_NODE_MAX_CPU_LORAS_CEILING, the base model's max_lora_rank) and "
            "a registered one keeps its own; 'default' sets one back to the fleet's.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--agent-url", required=True)
        parser.add_argument("--engine-url", required=True)
        parser.add_argument("--base-model", required=True)
        parser.add_argument("--rotate", action="store_true", help="issue new credentials; the old ones stop working")
        for field in CAPACITY_FIELDS:
            parser.add_argument(f"--{field.replace('_', '-')}", dest=field, metavar="N|default",
                                help=f"ceiling on the {field} the node's heartbeats report (vLLM --"
                                     f"{field.replace('_', '-')} on its engine)")

    def handle(self, *args: Any, name: str, agent_url: str, engine_url: str, base_model: str, rotate: bool,
               **options: Any) -> None:
        ceilings = {field: _ceiling(f"--{field.replace('_', '-')}", options[field])
                    for field in CAPACITY_FIELDS if options.get(field) is not None}
        try:
            node, creds = node_register(name=name, agent_url=agent_url, engine_url=engine_url,
                                        base_model_name=base_model, rotate=rotate, ceilings=ceilings)
        except NodeRefused as exc:
            raise CommandError(exc.detail) from exc
        self.stderr.write(f"registered node {node.name} (key generation {node.key_generation}); give these to the "
                          "node only (VLLM_API_KEY = QUIVER_NODE_KEY on its engine):")
        self.stdout.write(f"QUIVER_NODE_NAME={node.name}\nQUIVER_NODE_KEY={creds.key}\nQUIVER_NODE_TOKEN={creds.token}")
