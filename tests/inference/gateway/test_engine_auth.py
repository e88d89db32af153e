"""An engine that refuses the gateway's node key (401/403) is a platform fault: the caller gets a 502 in OpenAI's
shape with our own message, never a 401 that makes its good key look revoked, and operators get an error log."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.gateway import app as gateway_app
from inference.gateway import exchange as gateway_exchange
from inference.gateway.app import GatewayApp
from inference.gateway.snapshot import NodeView
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.engine_answer import EngineAnswer

NODE = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)
# What the engine's guard (inference.node.engine_ext) answers a wrong node key with.
REFUSAL = {"error": {"message": "Unauthorized", "type": "invalid_request_error", "code": "unauthorized"}}




@pytest.mark.django_db
@pytest.mark.parametrize("engine_status", [401, 403])
@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_refusing_the_node_key_is_a_502_not_the_callers_401(
        monkeypatch: pytest.MonkeyPatch, base_model: Any, caplog: pytest.LogCaptureFixture, engine_status: int,
        stream: bool) -> None:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    recorded: list[int] = []

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> EngineAnswer:
        return EngineAnswer(engine_status, REFUSAL)

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    observe = gateway_app.metrics.request_observe
    monkeypatch.setattr(gateway_app.metrics, "request_observe",
                        lambda **kw: recorded.append(kw["status"]) or observe(**kw))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=GatewayApp(background=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "bot", "prompt": "x", "max_tokens": 1, "stream": stream})

    with caplog.at_level(logging.ERROR, logger="inference.gateway.app"):
        response = async_to_sync(go)()
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("upstream_auth_failed", "server_error")
    assert "not your API key" in error["message"] and "Unauthorized" not in response.text
    assert "www-authenticate" not in response.headers
    assert recorded == [502]  # metered as what the caller got
    logged = [r for r in caplog.records if r.getMessage() == "gateway.engine_auth_refused"]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    assert (logged[0].node, logged[0].status) == ("n1", engine_status)  # type: ignore[attr-defined]
