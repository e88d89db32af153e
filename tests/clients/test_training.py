"""The Trainer hook: a real (two-step) PEFT training run on the demo's tiny Llama pushes its adapter at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model
from quiver_client.training import QuiverPushCallback
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from adapters_app.models import AdapterVersion
from demo.assets import DemoAssets
from tests.clients.conftest import Tenancy

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_callback_pushes_the_trained_adapter_when_training_ends(tenancy: Tenancy, demo_assets: DemoAssets,
                                                                    base_model, tmp_path: Path) -> None:
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_assets.base_dir),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    rows = [{"input_ids": [1, 5, 9, 13, 2], "labels": [1, 5, 9, 13, 2]}] * 4
    hook = QuiverPushCallback("trained", base_model="tiny-llama", url=tenancy.url, api_key=tenancy.key,
                              state_folder=tmp_path / "state")
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, report_to=[],
                             save_strategy="no", use_cpu=True, learning_rate=1e-2)
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[hook]).train()

    assert hook.result is not None and hook.result.status == "ready" and hook.result.version == 1
    version = AdapterVersion.objects.get(tenant=tenancy.tenant, adapter__name="trained")
    assert version.status == "ready" and version.r == 8
    assert (tmp_path / "out" / "quiver-push" / "adapter_model.safetensors").exists()
