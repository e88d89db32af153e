"""Nothing under ``/v1/`` answers a non-OpenAI-shaped error: the guard's catch-all, and the edge bodies that used
to reach it (deep JSON, a non-string ``model``) answered as 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from config.asgi import application
from inference.gateway import app as gateway
from inference.gateway.app import GatewayApp
from inference.gateway.guard import OpenAIErrorGuard
from tenants.services import api_key_create
from tests.asgi_call import asgi_exchange, http_scope
from tests.factories import TenantFactory


def _call(app: Any, method: str, path: str, body: bytes = b"",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return asgi_exchange(app, http_scope(method, path, headers), receive)


async def _raises(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("secret engine detail")


async def _html_500(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/html")]})
    await send({"type": "http.response.body", "body": b"<h1>Traceback: secret</h1>"})


async def _plain_503(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"upstream ", "more_body": True})
    await send({"type": "http.response.body", "body": b"gone"})


def _openai_error(raw: bytes) -> dict[str, Any]:
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_an_exception_under_v1_is_a_json_500_without_its_text() -> None:
    status, headers, raw = _call(OpenAIErrorGuard(_raises), "POST", "/v1/completions")
    assert status == 500 and headers["content-type"] == "application/json"
    assert _openai_error(raw)["code"] == "internal_error"
    assert b"secret" not in raw


@pytest.mark.parametrize(("app", "status"), [(_html_500, 500), (_plain_503, 503)])
def test_a_non_json_5xx_under_v1_is_replaced_by_the_openai_shape(app: Any, status: int) -> None:
    got, headers, raw = _call(OpenAIErrorGuard(app), "GET", "/v1/models")
    assert got == status and headers["content-type"] == "application/json"
    assert _openai_error(raw)["type"] == "server_error"
    assert b"secret" not in raw and b"gone" not in raw


def test_other_paths_pass_through_untouched() -> None:
    status, headers, raw = _call(OpenAIErrorGuard(_html_500), "GET", "/api/v1/adapters")
    assert (status, headers["content-type"], raw) == (500, "text/html", b"<h1>Traceback: secret</h1>")
    with pytest.raises(RuntimeError):
        _call(OpenAIErrorGuard(_raises), "GET", "/healthz")


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("body", "code", "param"), [
    (b"[" * 200_000 + b"]" * 200_000, "invalid_json", None),  # past the JSON parser's depth limit
    (b'{"model": ' + b"[" * 50_000 + b"]" * 50_000 + b', "prompt": "x"}', "invalid_json", None),
    (b'{"model": ["tiny-llama"], "prompt": "x"}', "invalid_type", "model"),
    (b'{"model": {"name": "bot"}, "messages": []}', "invalid_type", "model"),
    (b'{"model": 7, "prompt": "x"}', "invalid_type", "model"),
    (b'{"model": "", "prompt": "x"}', "missing_model", "model"),
    (b'{"prompt": "x"}', "missing_model", "model"),
    (b'{"model": "tiny\\u0000llama", "prompt": "x"}', "invalid_value", "model"),  # PostgreSQL refuses NUL: was 500
    (b'{"model": "' + b"m" * 257 + b'", "prompt": "x"}', "invalid_value", "model"),  # unknown names are cached
])
def test_edge_bodies_on_the_real_app_are_400_naming_the_field(path: str, body: bytes, code: str, param: str | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole ASGI stack of config.asgi, with a gateway that starts no background tasks in this short-lived loop.
    monkeypatch.setattr(gateway, "application", GatewayApp(background=False))
    _, key = api_key_create(TenantFactory(), name="k")
    status, headers, raw = _call(application, "POST", path, body,
                                 {"authorization": f"Bearer {key}", "content-type": "application/json",
                                  "content-length": str(len(body))})
    assert status == 400 and headers["content-type"] == "application/json", raw[:200]
    error = _openai_error(raw)
    assert (error["code"], error["param"]) == (code, param)
    if param == "model" and code == "invalid_type":
        assert "'model'" in error["message"] and "string" in error["message"]
