"""``quiver chat`` and ``quiver usage`` on real traffic: push a demo adapter, ask it through the gateway on the
session's vLLM CPU node, then read the metered usage back."""

from __future__ import annotations

import csv
import io

import pytest

from demo.assets import DemoAssets
from tests.clients.conftest import Tenancy

pytestmark = pytest.mark.django_db(transaction=True)


def test_chat_with_a_pushed_adapter_then_its_usage(quiver, tenancy: Tenancy, demo_assets: DemoAssets, base_model,
                                                   live_node) -> None:
    pushed = quiver("push", str(demo_assets.adapters["capitals"]), "--name", "capitals", "--base-model",
                    "tiny-llama", "--json")
    assert pushed.rc == 0, pushed.stderr
    assert pushed.json()["status"] == "ready"
    example = demo_assets.examples["capitals"][0]

    streamed = quiver("chat", "capitals", example["prompt"], "--max-tokens", "12")
    assert streamed.rc == 0, streamed.stderr
    assert streamed.stdout.strip() == example["completion"].strip()
    answered = quiver("chat", "capitals", example["prompt"], "--max-tokens", "12", "--json")
    assert answered.rc == 0, answered.stderr
    body = answered.json()
    assert body["model"] == "capitals"
    assert body["choices"][0]["message"]["content"].strip() == example["completion"].strip()
    unknown = quiver("chat", "no-such-adapter", "hi")
    assert unknown.rc == 1 and "HTTP 404" in unknown.stderr

    usage = quiver("usage", "--since", "1h", "--json")
    assert usage.rc == 0
    rows = {r["model"]: r for r in usage.json()}
    assert rows["capitals"]["requests"] == 2 and rows["capitals"]["version"] == 1
    assert rows["capitals"]["completion_tokens"] > 0
    records = list(csv.DictReader(io.StringIO(quiver("usage", "--csv").stdout)))
    assert sum(1 for r in records if r["model"] == "capitals") == 2
    assert "capitals" in quiver("usage").stdout
