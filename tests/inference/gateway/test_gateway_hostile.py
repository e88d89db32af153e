"""Hostile inputs at the gateway's front (found by attacking the demo stack): each is a 4xx, never a 500.

- a JSON ``\\ud800`` escape (an unpaired surrogate) in any field: a str that cannot be encoded as UTF-8, which failed
  as a 500 in the database query for ``model`` and in the token estimate for ``prompt``/``messages``;
- a non-ASCII key secret behind a real key id: ``hmac.compare_digest`` raises on non-ASCII str once the key's
  secret is cached (a 500 for anyone who saw a key id).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway.app import GatewayApp
from inference.gateway.errors import GatewayError
from tenants.services import api_key_create
from tests.factories import TenantFactory


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "\\ud800", "prompt": "x"}', "model"),
    (b'{"model": "m", "prompt": "\\u0000\\uDBFF"}', "prompt"),
    (b'{"model": "m", "prompt": ["ok", "\\udc00"]}', "prompt"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800x"}]}', "messages"),
    (b'{"model": "m", "prompt": "x", "stop": "\\ude00"}', "stop"),
    (b'{"model": "m", "prompt": "x", "\\ud800": 1}', "body"),
])
def test_an_unpaired_surrogate_is_a_400_naming_the_field(raw: bytes, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        GatewayApp._parse(raw)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, "invalid_value")


def test_paired_surrogates_and_plain_unicode_pass() -> None:
    body = GatewayApp._parse('{"model": "m", "prompt": "\\ud83d\\ude00 é 日本"}'.encode())
    assert body["prompt"] == "\U0001f600 é 日本"


@pytest.mark.django_db
def test_a_non_ascii_secret_behind_a_real_key_id_is_a_401(base_model: Any) -> None:
    _, key = api_key_create(TenantFactory(), name="app")
    app = GatewayApp(background=False)

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            for secret in (key, key.split(".")[0] + ".é", key + "é"):  # the first caches the verified secret
                answer = await http.post("/v1/completions", json={"model": "nope", "prompt": "x"},
                                         headers={"Authorization": f"Bearer {secret}".encode()})
                statuses.append(answer.status_code)
                if answer.status_code == 401:
                    assert answer.json()["error"]["code"] == "invalid_api_key"
        return statuses

    assert async_to_sync(go)() == [404, 401, 401]
