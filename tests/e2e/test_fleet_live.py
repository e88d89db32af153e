"""Fleet residency on a real node: the session's vLLM CPU engine, its node agent (heartbeat every second), a real
Celery worker, the gateway, PostgreSQL, Redis and S3.

Engine loads are the engine's own count (``inference.node.worker_ext``: calls of vLLM's ``_load_adapter`` per
``lora_int_id``), read from the agent's state report; residency is the engine's own lists (``/quiver/v1/loras``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters_app.models import AdapterVersion
from demo.api_client import upload_adapter, wait_validated
from inference.gateway.models import Node, Placement
from inference.gateway.node_client import node_call
from inference.gateway.node_keys import node_credentials
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)
HEARTBEAT_S = 1.0  # tests.fixtures.stack.node_agent


def _wait(what: str, check: Callable[[], Any], timeout: float = 90.0, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def _agent_state(agent: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {node_credentials(agent.node_name).key}"}
    return httpx.get(agent.url + "/v1/state", headers=headers, timeout=60).json()


def _engine_lists(agent: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {node_credentials(agent.node_name).key}"}
    return httpx.get(agent.engine_url + "/quiver/v1/loras", headers=headers, timeout=60).json()


def _loads(agent: Any, lora_int_id: int) -> int:
    residency = _engine_lists(agent)["residency"]
    return int(residency["loads"].get(str(lora_int_id), 0))


def _entry(agent: Any, version: AdapterVersion) -> dict[str, Any] | None:
    return next((a for a in _agent_state(agent)["adapters"] if a["lora_int_id"] == version.pk), None)


def _served(agent: Any, version: AdapterVersion) -> bool:
    entry = _entry(agent, version)
    return bool(entry and entry["served"] and entry["tier"] in ("hot", "warm"))


def _ready(api: httpx.Client, tenant: Any, name: str, folder: Path) -> AdapterVersion:
    number = upload_adapter(api, name, folder, base_model="tiny-llama")["number"]
    assert wait_validated(api, name, number, timeout=180)["status"] == "ready"
    return AdapterVersion.objects.select_related("adapter__tenant", "adapter__base_model").get(
        adapter__tenant=tenant, adapter__name=name, number=number)


@pytest.fixture
def tenant_api(gateway_server: str) -> tuple[Any, httpx.Client]:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    return tenant, httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=300)


def _complete(api: httpx.Client, model: str, *, attempts: int = 20) -> httpx.Response:
    """One completion; admission's 429 (busy engine) and a warm still loading are retried, as a client would."""
    for _ in range(attempts):
        resp = api.post("/v1/completions", json={"model": model, "prompt": "the cat", "max_tokens": 2,
                                                 "temperature": 0})
        code = resp.json().get("error", {}).get("code") if resp.status_code >= 400 else None
        if resp.status_code == 429 or code == "adapter_warm_timeout":
            time.sleep(float(resp.headers.get("Retry-After", "1")))
            continue
        return resp
    return resp


def _make_cold(node: Node, agent: Any, version: AdapterVersion) -> None:
    """Off the node entirely (engine and disk) and no placement row: only S3 holds it."""
    _wait("the warm after validation", lambda: _served(agent, version))
    node_call(node, "/v1/adapters/unload", {"lora_name": version.served_name, "purge": True})
    _wait("the node to stop reporting it", lambda: _entry(agent, version) is None, timeout=30)
    Placement.objects.filter(adapter_version=version).delete()


def test_fifty_concurrent_first_requests_make_one_engine_load(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "burst", demo_assets.adapters["capitals"])
    _make_cold(live_node, node_agent, version)
    before = _loads(node_agent, version.pk)

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda _: _complete(api, "burst"), range(50)))

    assert [a.status_code for a in answers] == [200] * 50, [a.text for a in answers if a.status_code != 200][:3]
    assert _loads(node_agent, version.pk) - before == 1  # one engine load for all 50
    assert Placement.objects.filter(adapter_version=version).count() == 1
