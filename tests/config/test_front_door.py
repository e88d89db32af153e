"""The front door (config.front_door): body caps while reading, and no body read without credentials."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import override_settings

from config.asgi import application
from devtools.proc import free_port
from inference.gateway import app as gateway
from inference.gateway.app import GatewayApp
from tenants.services import api_key_create
from tests.asgi_call import asgi_call, http_scope
from tests.factories import TenantFactory

REPO = Path(__file__).resolve().parents[2]
CHUNK = 64 * 1024


class Body:
    """A fake ASGI receive: ``chunks`` chunks of 64 KiB, counting what the application pulled."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks
        self.pulled = 0

    async def __call__(self) -> dict[str, Any]:
        if self.left <= 0:
            await asyncio.sleep(3600)  # the client stays connected; Django cancels this once it has answered
        self.left -= 1
        self.pulled += CHUNK
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": self.left > 0}


@pytest.fixture(autouse=True)
def _gateway_without_background(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each in-process call runs in a loop of its own that closes once the answer is sent. The real app starts its
    # background loops (admission, usage sink, invalidation) on the first request; one caught inside a database call
    # when the loop closes waits forever for the thread that closed it (the whole suite hung here in CI).
    monkeypatch.setattr(gateway, "application", GatewayApp(background=False))


def _call(method: str, path: str, body: Body, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    return asgi_call(application, http_scope(method, path, headers), body)


UPLOAD = "/api/v1/adapters/bot/versions"


@pytest.mark.parametrize("path", [UPLOAD, "/v1/chat/completions", "/v1/completions", "/internal/v1/nodes/heartbeat"])
def test_no_credentials_is_refused_before_any_byte_is_read(path: str) -> None:
    body = Body(10)
    status, data = _call("POST", path, body, {"transfer-encoding": "chunked"})
    assert status == 401 and body.pulled == 0
    assert (data["error"]["code"] if path.startswith("/v1/") else data["code"]) == "not_authenticated"
    message = data["error"]["message"] if path.startswith("/v1/") else data["detail"]
    assert "`Authorization: Bearer qv_<id>.<secret>`" in message  # what to send (issue 30)
    # The gateway takes keys only: it never suggests signing in; the control plane takes a console session too.
    assert ("sign in to the console" in message) is not path.startswith("/v1/"), message


@pytest.mark.django_db
def test_an_invalid_key_on_the_upload_route_is_refused_before_reading() -> None:
    body = Body(10)
    status, data = _call("POST", UPLOAD, body, {"authorization": "Bearer qv_nope.nope"})
    assert (status, data["code"], body.pulled) == (401, "invalid_api_key", 0)
    assert "`Authorization: Bearer qv_<id>.<secret>`" in data["detail"]
    # Not a bearer header at all: said so (it read "invalid API key"), still before any byte.
    body = Body(10)
    status, data = _call("POST", UPLOAD, body, {"authorization": "Basic dXNlcjpwYXNz"})
    assert (status, data["code"], body.pulled) == (401, "invalid_auth_header", 0)
    assert data["detail"].startswith("The Authorization header is not a bearer API key")


@pytest.mark.django_db
@override_settings(QUIVER_MAX_JSON_BYTES=256 * 1024)
def test_a_json_body_on_the_upload_route_keeps_the_json_cap() -> None:
    # DRF parses JSON in memory: an upload-sized JSON body would be a memory bomb, not a spool file.
    _, secret = api_key_create(TenantFactory(), name="ci", scopes=["adapters:write"])
    body = Body(100)
    status, data = _call("POST", UPLOAD, body, {"authorization": f"Bearer {secret}", "content-type": "application/json",
                                                "transfer-encoding": "chunked"})
    assert status == 413 and data["code"] == "request_too_large" and "QUIVER_MAX_JSON_BYTES" in data["detail"]
    assert body.pulled <= 256 * 1024 + CHUNK


@pytest.mark.django_db
def test_a_key_without_adapters_write_is_refused_on_the_upload_route_before_reading() -> None:
    # The applications' inference keys are the most exposed; they must not spool upload-sized bodies to disk.
    _, secret = api_key_create(TenantFactory(), name="app", scopes=["inference", "adapters:read"])
    body = Body(10)
    status, data = _call("POST", UPLOAD, body, {"authorization": f"Bearer {secret}", "transfer-encoding": "chunked"})
    assert (status, data["code"], body.pulled) == (403, "insufficient_scope", 0)


@pytest.mark.django_db
def test_a_viewer_session_is_refused_on_the_upload_route_before_reading(make_session_client: Any) -> None:
    client, _, _ = make_session_client(role="viewer")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    body = Body(10)
    status, data = _call("POST", UPLOAD, body, {"cookie": cookie, "transfer-encoding": "chunked"})
    assert (status, data["code"], body.pulled) == (403, "insufficient_scope", 0)


@pytest.mark.django_db
@override_settings(QUIVER_MAX_UPLOAD_BYTES=1024 * 1024)
def test_a_chunked_upload_past_the_cap_stops_being_read() -> None:
    _, key = api_key_create(TenantFactory(), name="k")
    body = Body(1000)  # 62.5 MiB offered
    status, data = _call("POST", UPLOAD, body, {"authorization": f"Bearer {key}",
                                                "content-type": "multipart/form-data; boundary=b"})
    assert (status, data["code"]) == (413, "request_too_large")
    assert "QUIVER_MAX_UPLOAD_BYTES" in data["detail"]
    assert body.pulled <= 1024 * 1024 + 64 * 1024 + CHUNK


@pytest.mark.django_db
@override_settings(QUIVER_MAX_JSON_BYTES=256 * 1024)
def test_json_routes_have_their_own_smaller_cap() -> None:
    _, key = api_key_create(TenantFactory(), name="k")
    body = Body(100)
    status, data = _call("POST", "/v1/completions", body, {"authorization": f"Bearer {key}"})
    assert status == 413 and data["error"]["code"] == "request_too_large"
    assert body.pulled <= 256 * 1024 + CHUNK
    declared = Body(100)
    status, _ = _call("POST", "/v1/completions", declared, {"authorization": "Bearer qv_x.y",
                                                            "content-length": str(300 * 1024)})
    assert status == 413 and declared.pulled == 0


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/completions", "/api/v1/adapters", "/api/v1/tenants"])
@pytest.mark.parametrize("credentials", [
    {"authorization": "Bearer qv_x.y"},
    {"authorization": "Basic eDp5"},
    {"cookie": "sessionid=forged"},
])
def test_junk_credentials_do_not_lift_the_anonymous_cap(path: str, credentials: dict[str, str]) -> None:
    # Any Authorization header used to buy QUIVER_MAX_JSON_BYTES (4 MiB) of body read before anything checked it.
    chunked = Body(10)
    status, data = _call("POST", path, chunked, {**credentials, "transfer-encoding": "chunked"})
    code = data["error"]["code"] if path.startswith("/v1/") else data["code"]
    assert status == 401 and chunked.pulled == 0
    assert code in {"invalid_api_key", "invalid_auth_header", "not_authenticated"}
    declared = Body(10)
    status, _ = _call("POST", path, declared, {**credentials, "content-length": str(10 * CHUNK)})
    assert status == 401 and declared.pulled == 0


@pytest.mark.django_db
def test_good_credentials_still_get_the_json_cap(make_session_client: Any) -> None:
    _, key = api_key_create(TenantFactory(), name="k", scopes=["adapters:write"])
    body = Body(3)  # 192 KiB: past the anonymous cap, within the JSON cap
    status, data = _call("POST", "/api/v1/adapters", body, {"authorization": f"Bearer {key}",
                                                            "content-length": str(3 * CHUNK),
                                                            "content-type": "application/json"})
    assert status == 400 and body.pulled == 3 * CHUNK, data  # DRF read it all and found no JSON in the x's
    client, _, _ = make_session_client(role="owner")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    body = Body(3)
    status, _ = _call("POST", "/api/v1/adapters", body, {"cookie": cookie, "content-length": str(3 * CHUNK),
                                                         "content-type": "application/json"})
    assert status in {400, 403} and body.pulled == 3 * CHUNK  # 403 would be CSRF: read, then refused by Django


def test_anonymous_bodies_elsewhere_are_small() -> None:
    body = Body(100)
    status, data = _call("POST", "/admin/login/", body)
    assert status == 413 and data["code"] == "request_too_large"
    assert body.pulled <= 64 * 1024 + CHUNK


@pytest.mark.django_db
def test_a_body_within_its_cap_reaches_django() -> None:
    status, data = _call("POST", "/v1/completions", Body(1), {"authorization": "Basic eDp5"})
    assert status == 401 and "Bearer" in data["error"]["message"]  # the gateway's own answer


@pytest.fixture(scope="module")
def uvicorn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, int, Path]]:
    """``uvicorn config.asgi:application`` in a subprocess, temp files in a folder of its own."""
    tmp = tmp_path_factory.mktemp("front-door-tmp")
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--lifespan", "off", "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield "127.0.0.1", port, proc.pid, tmp
        assert proc.poll() is None, "server died"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _io(pid: int) -> dict[str, int]:
    pairs = (line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return {k: int(v) for k, v in pairs}


@pytest.mark.parametrize("path", [UPLOAD, "/v1/chat/completions"])
def test_unauthenticated_2gb_chunked_body_is_refused_fast_without_disk(uvicorn_server, path: str) -> None:
    host, port, pid, tmp = uvicorn_server
    before = _io(pid)
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
                 "Content-Type: multipart/form-data; boundary=b\r\n\r\n".encode())
    chunk = b"%x\r\n" % (1024 * 1024) + b"x" * (1024 * 1024) + b"\r\n"
    sent = 0

    def flood() -> None:  # 2 GB in 1 MiB chunks, until the server stops taking them
        nonlocal sent
        try:
            while sent < 2 * 1024**3:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass

    started = time.monotonic()
    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    answer = sock.recv(4096)
    elapsed = time.monotonic() - started
    sock.close()
    writer.join(timeout=10)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert elapsed < 1.0
    after = _io(pid)
    # Nothing of the body was read from the socket or written anywhere (files or sockets) by the server.
    assert after["rchar"] - before["rchar"] < 10 * 1024**2
    assert after["wchar"] - before["wchar"] < 10 * 1024**2
    assert sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) < 10 * 1024**2

