"""``manage.py quiver_base_model_register`` is idempotent and says so: a second run (the demo already ran the first)
updates the one base model instead of reading as a second one."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from adapters_app.models import BaseModel

pytestmark = pytest.mark.django_db
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
          "max_position_embeddings": 512}


def test_a_second_registration_updates_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    outputs = []
    for rank in (16, 32):
        out = io.StringIO()
        call_command("quiver_base_model_register", "tiny-test", str(tmp_path), "--max-lora-rank", str(rank), stdout=out)
        outputs.append(out.getvalue().strip())
    assert outputs == ["registered tiny-test (LlamaForCausalLM)",
                       "updated (already registered) tiny-test (LlamaForCausalLM)"]
    assert list(BaseModel.objects.filter(base_model_name="tiny-test").values_list("max_lora_rank", flat=True)) == [32]
