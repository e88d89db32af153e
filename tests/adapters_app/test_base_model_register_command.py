"""``manage.py quiver_base_model_register`` is idempotent and says so: a second run (the demo already ran the first)
updates the one base model instead of reading as a second one. It stores the folder's ``tokenizer.json`` for the
gateway's prompt counts, refuses one the ``tokenizers`` library cannot load, and says when there is none."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from adapters_app.models import BaseModel, BaseModelTokenizer

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
    assert [o.splitlines()[0] for o in outputs] == ["registered tiny-test (LlamaForCausalLM)",
                                                    "updated (already registered) tiny-test (LlamaForCausalLM)"]
    assert all("no " in o and "tokenizer.json" in o for o in outputs)  # this folder has none: said, not silent
    assert not BaseModelTokenizer.objects.exists()
    assert list(BaseModel.objects.filter(base_model_name="tiny-test").values_list("max_lora_rank", flat=True)) == [32]


def test_the_folders_tokenizer_is_stored_and_a_broken_one_refused(tmp_path: Path, tiny_base_dir: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    text = (tiny_base_dir / "tokenizer.json").read_text()
    (tmp_path / "tokenizer.json").write_text(text)
    call_command("quiver_base_model_register", "tiny-test", str(tmp_path), stdout=io.StringIO())
    stored = BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test")
    assert (stored.tokenizer_json, stored.sha256) == (text, hashlib.sha256(text.encode()).hexdigest())

    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "NotAModel"}}')
    with pytest.raises(CommandError, match="tokenizer.json does not load.*--no-tokenizer"):
        call_command("quiver_base_model_register", "tiny-test", str(tmp_path), "--max-lora-rank", "64",
                     stdout=io.StringIO())
    # Nothing half-written: the limits and the stored tokenizer are as they were.
    assert BaseModel.objects.get(base_model_name="tiny-test").max_lora_rank == 16
    assert BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test").tokenizer_json == text

    call_command("quiver_base_model_register", "tiny-test", str(tmp_path), "--no-tokenizer", "--max-lora-rank", "32",
                 stdout=io.StringIO())  # the broken file is not read; the stored one stays
    assert BaseModel.objects.get(base_model_name="tiny-test").max_lora_rank == 32
    assert BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test").sha256 == stored.sha256


def test_the_chat_template_and_special_tokens_are_stored_and_a_broken_template_refused(
        tmp_path: Path, tiny_base_dir: Path) -> None:
    """The folder's ``chat_template.jinja`` wins over ``tokenizer_config.json``'s ``chat_template`` (as transformers
    loads them); the special tokens come from ``tokenizer_config.json``, ``AddedToken`` objects as their text. A
    template that does not compile is refused with nothing written; a folder without one says chats go to the
    engine."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "tokenizer.json").write_text((tiny_base_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>", "chat_template": "from config"}))
    out = io.StringIO()
    call_command("quiver_base_model_register", "tiny-test", str(tmp_path), stdout=out)
    stored = BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test")
    assert (stored.chat_template, stored.special_tokens) == ("from config", {"bos_token": "<s>", "eos_token": "</s>"})
    assert "chat template" not in out.getvalue()

    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    call_command("quiver_base_model_register", "tiny-test", str(tmp_path), stdout=io.StringIO())
    updated = BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test")
    assert updated.chat_template.startswith("{{ bos_token }}") and updated.sha256 != stored.sha256

    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(CommandError, match="chat template does not compile.*chat_template.jinja.*--no-tokenizer"):
        call_command("quiver_base_model_register", "tiny-test", str(tmp_path), "--max-lora-rank", "64",
                     stdout=io.StringIO())
    assert BaseModel.objects.get(base_model_name="tiny-test").max_lora_rank == 16
    assert BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test").sha256 == updated.sha256

    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{}")
    out = io.StringIO()
    call_command("quiver_base_model_register", "tiny-test", str(tmp_path), stdout=out)
    assert "no chat template" in out.getvalue() and "count chats" in out.getvalue()
    assert BaseModelTokenizer.objects.get(base_model__base_model_name="tiny-test").chat_template == ""
