"""DRF's generic parse, media-type and authentication errors name the fix, in the API's ``{"detail", "code"}``
envelope with DRF's own status and code (fresh-user round, issue 30: "JSON parse error - Expecting value",
"Unsupported media type", "Authentication credentials were not provided." said what was wrong, not what to send)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
BEARER = "`Authorization: Bearer qv_<id>.<secret>`"


def test_malformed_json_names_the_content_type_and_shape(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    resp = client.post("/api/v1/api-keys", data=b"{name: bot}", content_type="application/json")
    body = resp.json()
    assert (resp.status_code, body["code"], set(body)) == (400, "parse_error", {"detail", "code"})
    assert body["detail"].startswith("JSON parse error") and "Content-Type: application/json" in body["detail"]


def _json_as_form(client: Any, path: str, data: bytes) -> dict[str, Any]:
    """POST ``data`` (JSON) labelled as a form, as ``curl -d`` without ``-H`` does; asserts the 400 ``parse_error``
    and returns its body."""
    resp = client.post(path, data=data, content_type="application/x-www-form-urlencoded")
    body: dict[str, Any] = resp.json()
    assert (resp.status_code, body["code"]) == (400, "parse_error"), body
    return body


def test_json_sent_as_a_form_is_refused_with_the_header_to_add(make_client) -> None:  # type: ignore[no-untyped-def]
    # What `curl -d '{"name": "bot"}'` sends: the view answered "name: This field is required." before.
    client, _, _ = make_client()
    body = _json_as_form(client, "/api/v1/api-keys", b'{"name": "bot"}')
    assert "-H 'Content-Type: application/json'" in body["detail"]
    # A real form still works where forms are read (the keys endpoint takes one).
    ok = client.post("/api/v1/api-keys", data=b"name=bot", content_type="application/x-www-form-urlencoded")
    assert ok.status_code == 201, ok.content


def test_json_sent_as_a_form_to_promote_names_the_header_not_a_missing_version(make_client,  # type: ignore[no-untyped-def]
                                                                               base_model) -> None:
    # The README's `curl -d '{"version": 2}' .../promote`, without its -H: it read "version: This field is required."
    from adapters_app.services import adapter_create

    client, tenant, _ = make_client()
    adapter_create(tenant, name="support-bot", base_model_name="tiny-llama")
    body = _json_as_form(client, "/api/v1/adapters/support-bot/promote", b'{"version": 2}')
    assert "JSON sent as a form" in body["detail"] and "-H 'Content-Type: application/json'" in body["detail"]
    assert "required" not in body["detail"]


def test_wrong_content_type_names_the_ones_the_endpoint_reads(make_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_client()
    resp = client.post("/api/v1/api-keys", data=b'{"name": "bot"}', content_type="text/plain")
    body = resp.json()
    assert (resp.status_code, body["code"]) == (415, "unsupported_media_type"), body
    assert "Send a JSON body with `Content-Type: application/json`" in body["detail"]
    assert "this endpoint reads application/json, multipart/form-data" in body["detail"]


def test_missing_and_wrong_credentials_say_what_to_send(make_client) -> None:  # type: ignore[no-untyped-def]
    anonymous = APIClient().get("/api/v1/adapters")
    body = anonymous.json()
    assert (anonymous.status_code, body["code"]) == (401, "not_authenticated")
    assert BEARER in body["detail"] and "quiver keys create" in body["detail"]
    assert anonymous["WWW-Authenticate"] == 'Bearer realm="quiver"'  # DRF's 401 kept, not turned into a 403

    basic = APIClient()
    basic.credentials(HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    resp = basic.get("/api/v1/adapters")
    assert (resp.status_code, resp.json()["code"]) == (401, "invalid_auth_header")
    assert BEARER in resp.json()["detail"]

    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION="Bearer qv_nothere.nosecret")
    resp = stale.get("/api/v1/adapters")
    assert (resp.status_code, resp.json()["code"]) == (401, "invalid_api_key")
    assert BEARER in resp.json()["detail"] and "API keys page" in resp.json()["detail"]


def test_gateway_401s_say_what_to_send() -> None:
    # /v1/models is Django's; /v1/completions (the ASGI app) uses the same texts (common.auth_hints).
    resp = APIClient().get("/v1/models")
    assert resp.status_code == 401 and BEARER in resp.json()["error"]["message"], resp.content


def test_missing_csrf_token_names_the_header(make_session_client) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = make_session_client()
    client.handler.enforce_csrf_checks = True
    resp = client.post("/api/v1/api-keys", {"name": "bot"}, format="json")
    body = resp.json()
    assert (resp.status_code, body["code"]) == (403, "permission_denied"), body
    assert body["detail"].startswith("CSRF Failed") and "`X-CSRFToken`" in body["detail"]
