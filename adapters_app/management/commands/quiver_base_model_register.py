"""``manage.py quiver_base_model_register <name> <model_dir>``: register a base model from its ``config.json``, with
its ``tokenizer.json`` when the folder has one (the gateway counts prompts for TPM limits with it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from adapters_app.models import BaseModel
from adapters_app.services import base_model_register


class Command(BaseCommand):
    help = ("Register a base model (architecture facts read from <model_dir>/config.json; its tokenizer from "
            "<model_dir>/tokenizer.json when present).")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("base_model_name")
        parser.add_argument("model_dir", type=Path)
        parser.add_argument("--node-pool", default="default")
        parser.add_argument("--max-lora-rank", type=int, default=16)
        parser.add_argument("--no-tokenizer", action="store_true",
                            help="do not store tokenizer.json: gateways ask the engine to count prompts")

    def handle(self, *args: Any, base_model_name: str, model_dir: Path, node_pool: str, max_lora_rank: int,
               no_tokenizer: bool, **options: Any) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        tokenizer_path = model_dir / "tokenizer.json"
        tokenizer_json = None if no_tokenizer or not tokenizer_path.is_file() else tokenizer_path.read_text()
        existed = BaseModel.objects.filter(base_model_name=base_model_name).exists()
        try:
            base = base_model_register(base_model_name=base_model_name, hf_config=config, node_pool=node_pool,
                                       max_lora_rank=max_lora_rank, tokenizer_json=tokenizer_json)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        # Idempotent (the demo already ran it): say which, so a second run is not read as a second base model.
        verb = "updated (already registered)" if existed else "registered"
        self.stdout.write(f"{verb} {base.base_model_name} ({base.architecture})")
        if tokenizer_json is None and not no_tokenizer:
            self.stdout.write(f"  no {tokenizer_path}: gateways will ask the engine to count prompts for TPM limits")
