"""``manage.py quiver_base_model_register <name> <model_dir>``: register a base model from its ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from adapters_app.models import BaseModel
from adapters_app.services import base_model_register


class Command(BaseCommand):
    help = "Register a base model (architecture facts read from <model_dir>/config.json)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("base_model_name")
        parser.add_argument("model_dir", type=Path)
        parser.add_argument("--node-pool", default="default")
        parser.add_argument("--max-lora-rank", type=int, default=16)

    def handle(self, *args: Any, base_model_name: str, model_dir: Path, node_pool: str, max_lora_rank: int,
               **options: Any) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        existed = BaseModel.objects.filter(base_model_name=base_model_name).exists()
        base = base_model_register(
            base_model_name=base_model_name, hf_config=config, node_pool=node_pool, max_lora_rank=max_lora_rank
        )
        # Idempotent (the demo already ran it): say which, so a second run is not read as a second base model.
        verb = "updated (already registered)" if existed else "registered"
        self.stdout.write(f"{verb} {base.base_model_name} ({base.architecture})")
