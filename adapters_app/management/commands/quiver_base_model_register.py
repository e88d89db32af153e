"""``manage.py quiver_base_model_register <name> <model_dir>``: register a base model from its ``config.json``, with
its ``tokenizer.json`` when the folder has one, with the chat template and special tokens from ``chat_template.jinja``
and ``tokenizer_config.json`` (the gateway counts prompts and chats for TPM limits with them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from adapters_app.chat_template import chat_template_from_files, special_tokens_from_config
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
        chat_template, special_tokens = "", {}
        if tokenizer_json is not None:
            config_path, jinja_path = model_dir / "tokenizer_config.json", model_dir / "chat_template.jinja"
            try:
                tokenizer_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
            except ValueError as exc:
                raise CommandError(f"{config_path} is not JSON ({exc}); fix it or register with --no-tokenizer.") from exc
            jinja_text = jinja_path.read_text() if jinja_path.is_file() else None
            chat_template = chat_template_from_files(jinja_text, tokenizer_config)
            special_tokens = special_tokens_from_config(tokenizer_config)
        existed = BaseModel.objects.filter(base_model_name=base_model_name).exists()
        try:
            base = base_model_register(base_model_name=base_model_name, hf_config=config, node_pool=node_pool,
                                       max_lora_rank=max_lora_rank, tokenizer_json=tokenizer_json,
                                       chat_template=chat_template, special_tokens=special_tokens)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        # Idempotent (the demo already ran it): say which, so a second run is not read as a second base model.
        verb = "updated (already registered)" if existed else "registered"
        self.stdout.write(f"{verb} {base.base_model_name} ({base.architecture})")
        if tokenizer_json is None and not no_tokenizer:
            self.stdout.write(f"  no {tokenizer_path}: gateways will ask the engine to count prompts for TPM limits")
        elif tokenizer_json is not None and not chat_template:
            self.stdout.write(f"  no chat template in {model_dir}: gateways will ask the engine to count chats")
