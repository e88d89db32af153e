"""On the request path: while another tenant is active on the node, the heaviest tenant's streams ask vLLM for
coarse chunks (``stream_interval``); a lighter tenant's streams and every non-streamed request ask for none."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway import exchange as gateway_exchange
from inference.gateway.app import GatewayApp
from inference.gateway.snapshot import NodeView
from tenants.services import api_key_create
from tests.factories import TenantFactory

NODE = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)


class _Refusal:
    """The engine's answer: a 400, so the test needs no stream; the body it was sent is what the test reads."""

    status_code = 400
    is_event_stream = False

    async def aread(self) -> bytes:
        return json.dumps({"error": {"message": "no", "type": "BadRequestError", "code": 400}}).encode()

    async def aclose(self) -> None:
        pass


@pytest.mark.django_db
def test_only_the_heaviest_tenants_streams_carry_a_stream_interval(monkeypatch: pytest.MonkeyPatch, base_model: Any,
                                                                   settings: Any) -> None:
    settings.QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL = 8
    flood, quiet = TenantFactory(), TenantFactory()
    _, flood_key = api_key_create(flood, name="app")
    _, quiet_key = api_key_create(quiet, name="app")
    sent: list[dict[str, Any]] = []

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> _Refusal:
        sent.append(json.loads(content))
        return _Refusal()

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    app = GatewayApp(background=False)

    async def go() -> None:
        async def choose() -> NodeView:
            return NODE

        app._ensure_started()  # this loop's gate (the first request would make a new one)
        for _ in range(3):  # the flooder's streams already running on the node
            await app.admission.acquire(tenant=str(flood.pk), priority=0, prompt_tokens=1, choose=choose)
        _, quiet_slot = await app.admission.acquire(tenant=str(quiet.pk), priority=0, prompt_tokens=1, choose=choose)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            for key, stream in ((flood_key, True), (quiet_key, True), (flood_key, False)):
                await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"model": "tiny-llama", "prompt": "x", "max_tokens": 4, "stream": stream})
            own = await http.post("/v1/completions", headers={"Authorization": f"Bearer {quiet_key}"},
                                  json={"model": "tiny-llama", "prompt": "x", "stream": True, "stream_interval": 1})
            assert (own.status_code, own.json()["error"]["param"]) == (400, "stream_interval")  # not the client's
        app.admission.release(quiet_slot)

    async_to_sync(go)()
    assert [body.get("stream_interval") for body in sent] == [8, None, None]
