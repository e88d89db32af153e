"""Deeply nested JSON on any control-plane endpoint is a 400 ``parse_error`` in our envelope, never a 500."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
DEEP = b"[" * 50_000 + b"]" * 50_000


@pytest.mark.parametrize("url", ["/api/v1/adapters", "/api/v1/api-keys", "/api/v1/adapters/bot/versions",
                                 "/api/v1/members"])
def test_deep_json_is_a_400(make_client, url: str) -> None:
    client, _, _ = make_client()
    resp = client.post(url, data=DEEP, content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["code"] == "parse_error"


def test_deep_json_on_login_is_a_400() -> None:
    client = APIClient()
    resp = client.post("/api/v1/auth/login", data=DEEP, content_type="application/json")
    assert resp.status_code == 400, resp.content
