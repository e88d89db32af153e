"""Issue 3: adapters the validator accepts for each supported PEFT feature (rsLoRA, rank_pattern/alpha_pattern,
regex target_modules) are served end to end by vLLM through the gateway, token for token like transformers + PEFT."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from demo.api_client import upload_adapter, wait_validated
from demo.assets import DemoAssets
from demo.tiny_model import load_base, one_torch_thread, save_adapter
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.reference import greedy_ids

pytestmark = pytest.mark.django_db(transaction=True)

FEATURES = {
    "rslora": LoraConfig(r=16, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True,
                         lora_dropout=0.0, task_type="CAUSAL_LM"),
    "rank-pattern": LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "o_proj", "up_proj"],
                               rank_pattern={"o_proj": 4, "up_proj": 16}, alpha_pattern={"k_proj": 4},
                               lora_dropout=0.0, task_type="CAUSAL_LM"),
    "regex-targets": LoraConfig(r=8, lora_alpha=8, target_modules=r".*\.layers\.[13]\.(self_attn\.v_proj|mlp\.gate_proj)",
                                lora_dropout=0.0, task_type="CAUSAL_LM"),
}
PROMPTS = ["France:", "upper cat:", "3+4="]
NEW_TOKENS = 10


def _make(base_dir: Path, out: Path, config: LoraConfig, seed: int) -> tuple[Path, dict[str, list[int]]]:
    """Write a random (non-zero) PEFT adapter and its transformers+PEFT greedy token ids per prompt."""
    with one_torch_thread():
        model, tok = load_base(base_dir)
        peft_model = get_peft_model(model, config)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in sorted(peft_model.named_parameters()):
                if "lora_A" in name or "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
        save_adapter(peft_model, out, served_name="tiny-llama")
        reference = PeftModel.from_pretrained(load_base(base_dir)[0], out).eval()
        expected = {prompt: greedy_ids(reference, tok, prompt, NEW_TOKENS) for prompt in PROMPTS}
    return out, expected


def test_supported_peft_features_are_accepted_and_served_exactly(
    demo_assets: DemoAssets, base_model, gateway_server: str, celery_worker: None, live_node,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    _, key = api_key_create(TenantFactory(slug="features"), name="k")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=180)
    for seed, (name, config) in enumerate(FEATURES.items(), start=11):
        folder, expected = _make(demo_assets.base_dir, tmp_path / name, config, seed)
        number = upload_adapter(api, name, folder, base_model="tiny-llama")["number"]
        body = wait_validated(api, name, number, timeout=120)
        assert body["status"] == "ready", body["validation_report"]["problems"]
        for prompt, want in expected.items():
            out = api.post("/v1/completions", json={
                "model": name, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True,
            })
            assert out.status_code == 200, out.text
            assert out.json()["choices"][0]["token_ids"] == want, (name, prompt)
