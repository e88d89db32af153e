"""Integers past any real request's size are a 400 naming the field (attack round: ``max_tokens`` of 4,000 digits
parsed as a Python int, passed hygiene, and failed the fair-share cost with an OverflowError: a 500, the request's
admission left unsettled)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway.app import GatewayApp
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("endpoint", "body"), [
    ("completions", b'{"model":"tiny-llama","prompt":"x","max_tokens":1%s}'),
    ("chat/completions", b'{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"max_tokens":1%s}'),
    ("chat/completions", b'{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],'
                         b'"max_completion_tokens":1%s}'),
])
def test_a_length_past_int32_is_a_400_naming_it(base_model: Any, endpoint: str, body: bytes) -> None:
    _, key = api_key_create(TenantFactory(), name="app")
    app = GatewayApp(background=False)

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            return [await http.post(f"/v1/{endpoint}", content=body % (b"0" * zeros),
                                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
                    for zeros in (4000, 300, 10)]

    answers = async_to_sync(go)()
    field = "max_completion_tokens" if b"max_completion_tokens" in body else "max_tokens"
    assert [(r.status_code, r.json()["error"]["param"]) for r in answers] == [(400, field)] * 3
