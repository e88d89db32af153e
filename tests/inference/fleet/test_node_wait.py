"""``manage.py quiver_node_wait``: the demo's (and a deploy script's) wait for a node, read from the node's row, so
no tenant key probes the gateway and no refused request is metered to a tenant while the node warms up."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.utils import timezone

from inference.fleet.models import Node
from inference.fleet.nodes import node_register
from inference.metering.models import UsageRecord

pytestmark = pytest.mark.django_db


def _wait(name: str, timeout: str = "0") -> str:
    out = io.StringIO()
    call_command("quiver_node_wait", name, "--timeout", timeout, stdout=out)
    return out.getvalue()


def test_a_node_that_heartbeats_is_live(base_model: Any) -> None:
    _, creds = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                             base_model_name="tiny-llama")
    with pytest.raises(CommandError, match="'n1' was not live after 0 s: it has never sent a heartbeat"):
        _wait("n1")
    state = {"node": "n1", "healthy": True, "base_model": "tiny-llama", "engine_url": "http://n1:8000",
             "agent_url": "http://n1:8100", "max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 16, "adapters": [],
             "kv_cache_usage_perc": 0.1, "num_requests_running": 0, "num_requests_waiting": 0}
    with override_settings(ROOT_URLCONF="config.internal_urls"):
        beat = Client().post("/internal/v1/nodes/heartbeat", data=json.dumps(state), content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {creds.token}")
    assert beat.status_code == 200, beat.content
    assert _wait("n1", "5").startswith("node n1 is live")
    assert not UsageRecord.objects.exists()  # the wait went nowhere near the gateway


@override_settings(QUIVER_NODE_STALE_AFTER_S=30)
def test_a_stale_or_unhealthy_node_is_not_live_and_the_error_says_why(base_model: Any) -> None:
    node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000", base_model_name="tiny-llama")
    Node.objects.filter(name="n1").update(healthy=True, last_heartbeat_at=timezone.now() - timedelta(seconds=60))
    with pytest.raises(CommandError, match="too long ago.*QUIVER_CONTROL_URL"):
        _wait("n1")
    Node.objects.filter(name="n1").update(healthy=False, last_heartbeat_at=timezone.now())
    with pytest.raises(CommandError, match="reported itself unhealthy"):
        _wait("n1")


def test_an_unknown_node_and_a_negative_timeout_are_refused_at_once(base_model: Any) -> None:
    with pytest.raises(CommandError, match="No registered node is named 'ghost'; register it first"):
        _wait("ghost", "600")
    with pytest.raises(CommandError, match="--timeout must be 0 or more"):
        _wait("ghost", "-1")
