"""A flood of made-up credentials or model names does not push other tenants' keys and targets out of the gateway's
caches (attack round: one cache for hits and misses let 100,000 random bearer tokens, sent without any credential,
or 20,000 unknown model names from one tenant, evict every tenant's entries, so each of their next requests waited
for a database read on the process's one database thread, behind the flood's own)."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync

from inference.gateway.app import GatewayApp
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def test_made_up_keys_and_model_names_do_not_evict_the_entries_that_serve(base_model: Any) -> None:
    victim, attacker = TenantFactory(), TenantFactory()
    victim_key = api_key_create(victim, name="app")[1]
    attacker_key = api_key_create(attacker, name="app")[1]
    app = GatewayApp(background=False)
    ask = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}
    random_keys = [f"qv_{secrets.token_hex(6)}.{secrets.token_urlsafe(8)}" for _ in range(12)]
    flood = [(k, ask) for k in random_keys] + [(attacker_key, {**ask, "model": f"made-up-{i}"}) for i in range(12)]

    async def go() -> tuple[list[int], list[tuple[Any, ...]]]:
        # One event loop throughout: the app keeps one Directory per loop.
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            async def post(key: str, body: dict[str, Any]) -> int:
                return (await http.post("/v1/completions", json=body,
                                        headers={"Authorization": f"Bearer {key}"})).status_code
            statuses = [await post(victim_key, ask)]  # served as far as the node (none live): key and target cached
            # The production bounds are 100,000 keys and 20,000 targets; the same rule at a size a test can fill.
            app.directory.keys._max_entries, app.directory.targets._max_entries = 4, 4
            app.directory.bus_ok = True  # a process hearing invalidations: 60 s TTLs (without one, ~1 s)
            statuses += [await post(key, body) for key, body in flood]
            loads: list[tuple[Any, ...]] = []
            for cache in (app.directory.keys, app.directory.targets):
                cache._loader = (lambda load: lambda *k: loads.append(k) or load(*k))(cache._loader)
            statuses.append(await post(victim_key, ask))
            return statuses, loads

    statuses, loads = async_to_sync(go)()
    assert statuses == [503] + [401] * 12 + [404] * 12 + [503]
    assert loads == []  # the victim's key and target still served from the caches: no database read
