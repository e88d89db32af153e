"""A 404 for an adapter names it and where the names are listed (``quiver versions ls bot3`` printed "Not found."),
and says whether the adapter or the version is missing; another tenant's adapter, or one outside a key's adapters,
gets the very answer a name that exists nowhere gets."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from tenants.services import api_key_create

pytestmark = pytest.mark.django_db

NO_BOT3 = {"detail": "No adapter 'bot3' in this tenant; `quiver adapters ls` (GET /api/v1/adapters) lists yours.",
           "code": "not_found"}


def _ready(tenant: Any, name: str) -> None:
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")


def test_an_unknown_adapter_is_named_with_the_command_that_lists_them(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    _ready(tenant, "bot")
    for method, path, body in [("get", "/api/v1/adapters/bot3/versions", None),
                               ("get", "/api/v1/adapters/bot3", None),
                               ("get", "/api/v1/adapters/bot3/versions/1", None),
                               ("post", "/api/v1/adapters/bot3/promote", {"version": 1}),
                               ("delete", "/api/v1/adapters/bot3", None)]:
        resp = getattr(client, method)(path, body, format="json")
        assert (resp.status_code, resp.json()) == (404, NO_BOT3), (method, path)
    missing_version = client.get("/api/v1/adapters/bot/versions/9")
    assert (missing_version.status_code, missing_version.json()) == (404, {
        "detail": "Adapter 'bot' has no version 9; `quiver versions ls bot` lists them.", "code": "not_found"})
    assert client.get("/api/v1/adapters/bot/versions/1").status_code == 200


def test_another_tenants_adapter_and_one_outside_a_keys_list_answer_as_a_name_that_exists_nowhere(  # type: ignore[no-untyped-def]
        make_client, base_model) -> None:
    owner, tenant, _ = make_client()
    _ready(tenant, "bot3")
    stranger, _, _ = make_client()
    _, limited_key = api_key_create(tenant, name="limited", adapters=["other"])
    limited = APIClient()
    limited.credentials(HTTP_AUTHORIZATION=f"Bearer {limited_key}")
    for caller in (stranger, limited):
        for path in ("/api/v1/adapters/bot3/versions", "/api/v1/adapters/bot3", "/api/v1/adapters/bot3/versions/1"):
            resp = caller.get(path)
            assert (resp.status_code, resp.json()) == (404, NO_BOT3), path
    assert owner.get("/api/v1/adapters/bot3/versions").status_code == 200
