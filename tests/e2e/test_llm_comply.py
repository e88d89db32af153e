"""OpenAI conformance of the gateway, checked by ``llm-comply`` (PyPI; its OpenAI Chat Completions suite validates
responses against OpenAI's published schema and the semantics of choices, deltas, usage and ``[DONE]``), for the
base model and for a tenant's adapter, on a real vLLM CPU engine behind the real gateway.

What of the suite does not apply here, and why (each test below still runs against the real stack):

- ``chat-tool-calling``: the engine runs without a tool-call parser (``--enable-auto-tool-choice`` is off);
- ``chat-image-input``: the demo model is text-only;
- ``chat-reasoning-summary``: llm-comply skips it itself for non-reasoning models;
- ``finish_reason: expected 'stop'``: the demo model is a tiny random Llama and the tenant's ``max_tokens`` cap ends
  its answers, so ``finish_reason`` is ``length``; the error is ignored by that exact text, nothing else is.
- for the adapter only, ``no streaming chunk contained delta.content``: it was trained on short answers, and
  llm-comply samples (no ``temperature``), so now and then it ends at once and the stream carries no text (one
  whole-suite run in three; it passed alone each time). The base model, which never says EOS, keeps that check on the gateway's relay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import llm_comply
import pytest
from llm_comply.config import ComplianceConfig
from llm_comply.result import TestStatus
from llm_comply.runner import TestRunner
from llm_comply.schema import SpecLoader
from llm_comply.tests.openai_chat import OPENAI_CHAT_TESTS

from demo.api_client import upload_adapter, wait_validated
from demo.assets import DemoAssets
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)
CHECKS = ["chat-basic-response", "chat-system-prompt", "chat-multi-turn", "chat-streaming-response",
          "chat-streaming-usage", "chat-error-handling"]
MODEL_BEHAVIOUR = ["finish_reason: expected 'stop'"]


ADAPTER_BEHAVIOUR = ["no streaming chunk contained delta.content"]


def _comply(gateway_server: str, key: str, model: str, ignore: list[str]) -> dict[str, Any]:
    spec = SpecLoader(str(Path(llm_comply.__file__).parent / "specs" / "openai_chat.json"))
    config = ComplianceConfig(base_url=gateway_server + "/v1", api_key=key, model=model, filter_ids=CHECKS,
                              ignore_errors=ignore, timeout=300.0)
    suite = TestRunner(config=config, test_cases=OPENAI_CHAT_TESTS, spec_loader=spec).run_all()
    return {r.id: r for r in suite.results}


def test_gateway_passes_llm_comply_for_the_base_model_and_an_adapter(
    demo_assets: DemoAssets, base_model, gateway_server: str, celery_worker: None, live_node  # type: ignore[no-untyped-def]
) -> None:
    tenant = TenantFactory(slug="comply")
    limits_set(tenant, limits={"max_tokens_limit": 8})  # short answers: the demo model never says EOS
    _, key = api_key_create(tenant, name="comply")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    number = upload_adapter(api, "capitals", demo_assets.adapters["capitals"], base_model="tiny-llama")["number"]
    assert wait_validated(api, "capitals", number, timeout=120)["status"] == "ready"

    for model, ignore in (("tiny-llama", MODEL_BEHAVIOUR), ("capitals", MODEL_BEHAVIOUR + ADAPTER_BEHAVIOUR)):
        results = _comply(gateway_server, key, model, ignore)
        assert sorted(results) == sorted(CHECKS)  # every selected check ran
        failed = {i: r.errors for i, r in results.items() if r.status is not TestStatus.PASSED}
        assert not failed, f"{model}: {failed}"
