"""Each 503 the gateway answers leaves one WARNING line naming its code and target: node choice raised them without
a word, so an operator saw 503s in clients' reports and nothing in any log (a fresh user's finding)."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway.app import GatewayApp
from inference.logfmt import KeyValueFormatter
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def _post(app: GatewayApp, key: str, bodies: list[dict[str, Any]]) -> list[int]:
    async def go() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            return [(await http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                     ).status_code for body in bodies]
    return async_to_sync(go)()


def test_a_503_is_logged_once_with_its_code_and_target_and_a_404_is_not(base_model: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    tenant = TenantFactory(slug="acme")
    _, key = api_key_create(tenant, name="app")
    app = GatewayApp(background=False)
    with caplog.at_level(logging.WARNING, logger="inference.gateway"):
        statuses = _post(app, key, [{"model": "nope", "prompt": "x"},  # 404: the caller's mistake, no line
                                    {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}])  # no live node: 503
    assert statuses == [404, 503]
    lines = [r for r in caplog.records if r.getMessage() == "gateway.unavailable"]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    line = lines[0]
    assert line.levelno == logging.WARNING
    assert (line.code, line.status, line.model, line.served, line.base_model, line.version_id, line.tenant) == (  # type: ignore[attr-defined]
        "no_capacity", 503, "tiny-llama", "tiny-llama", "tiny-llama", None, "acme")
    assert "No live node serves base model `tiny-llama`." in line.detail  # type: ignore[attr-defined]
    text = KeyValueFormatter().format(line)  # as the process's log shows it: one line, the fields on it
    assert "\n" not in text
    assert "WARNING inference.gateway.errors gateway.unavailable code=no_capacity status=503 model=tiny-llama" in text
    assert "tenant=acme" in text
