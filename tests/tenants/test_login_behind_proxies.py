"""A spoofed ``X-Forwarded-For`` neither bypasses nor weaponises the login throttle (issue 30 point 5).

Real uvicorn processes on the test database, run with the demo's command line (no proxy: the header is never
believed) and with compose's (``--proxy-headers``, the header believed from ``FORWARDED_ALLOW_IPS`` only; here the
loopback address 127.0.0.3 plays Caddy). Clients bind distinct loopback addresses, so the server sees each as a
different peer. Under uvicorn's defaults (the demo before this change) the header was believed from 127.0.0.1, so
one client could guess on past the lock by changing it, and lock any account by spreading guesses over made-up
addresses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.run import web_argv
from tests.fixtures.web_process import web_process
from tests.test_compose import _rendered

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "the-right-password-1"
PROXY = "127.0.0.3"
THROTTLE = {"QUIVER_LOGIN_MAX_FAILURES": "3", "QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT": "6",
            "QUIVER_LOGIN_MAX_FAILURES_PER_IP": "50"}


def _client(url: str, source: str) -> httpx.Client:
    """A console client whose connections come from ``source``, holding the CSRF cookie."""
    client = httpx.Client(base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=source))
    assert client.get("/api/v1/auth/session").status_code == 200
    return client


def _login(client: httpx.Client, username: str, password: str, forwarded_for: str | None = None) -> int:
    headers = {"X-CSRFToken": client.cookies["csrftoken"]}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    return client.post("/api/v1/auth/login", json={"username": username, "password": password},
                       headers=headers).status_code


@pytest.fixture(scope="module")
def demo_web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    argv = web_argv("config.asgi:application", 0)
    argv[argv.index("--port") + 1] = "{port}"
    with web_process(argv, tmp_path_factory.mktemp("demo-web"), **THROTTLE) as url:
        yield url


@pytest.fixture(scope="module")
def compose_web(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """docker-compose.yml's web command as rendered by compose, on loopback, with 127.0.0.3 as its proxy's address."""
    web = _rendered(tmp_path_factory.mktemp("compose"))["services"]["web"]
    argv = list(web["command"])
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = "{port}"
    assert web["environment"]["FORWARDED_ALLOW_IPS"]  # compose's value is the edge subnet; here the stand-in proxy
    with web_process(argv, tmp_path_factory.mktemp("compose-web"), FORWARDED_ALLOW_IPS=PROXY, **THROTTLE) as url:
        yield url


@pytest.fixture
def operator(django_user_model: Any) -> str:
    django_user_model.objects.create_user(username="op", password=PASSWORD, is_staff=True)
    return "op"


def test_without_a_proxy_the_header_changes_nothing(demo_web: str, operator: str) -> None:
    attacker = _client(demo_web, "127.0.0.1")
    statuses = [_login(attacker, operator, f"guess-{i}", forwarded_for=f"198.51.100.{i}") for i in range(3)]
    assert statuses == [401, 401, 401]
    # Locked for this address whatever address the header claims: no bypass.
    after = [_login(attacker, operator, f"guess-{i}", forwarded_for=f"203.0.113.{i}") for i in range(20)]
    assert set(after) == {429}
    assert _login(attacker, operator, PASSWORD, forwarded_for="192.0.2.1") == 429
    # And those 20 claimed addresses locked nobody: the owner, elsewhere, logs in.
    assert _login(_client(demo_web, "127.0.0.2"), operator, PASSWORD) == 200


def test_guesses_spread_over_real_addresses_do_not_lock_the_owner_out(demo_web: str, operator: str) -> None:
    # Past the account-wide ceiling (6) from eight addresses: each of those is refused from now on...
    for i in range(10, 18):
        assert _login(_client(demo_web, f"127.0.1.{i}"), operator, "wrong") == 401
    assert _login(_client(demo_web, "127.0.1.10"), operator, PASSWORD) == 429
    # ... but the account still opens with its password from an address that never guessed wrong.
    assert _login(_client(demo_web, "127.0.0.4"), operator, PASSWORD) == 200


def test_behind_compose_proxy_the_header_counts_only_from_the_proxy(compose_web: str, operator: str) -> None:
    via_proxy = _client(compose_web, PROXY)
    # The proxy forwards client 203.0.113.7: its failures are counted against 203.0.113.7 ...
    assert [_login(via_proxy, operator, "wrong", forwarded_for="203.0.113.7") for _ in range(3)] == [401] * 3
    assert _login(via_proxy, operator, PASSWORD, forwarded_for="203.0.113.7") == 429
    # ... so another client behind the same proxy is not locked out with it.
    assert _login(via_proxy, operator, PASSWORD, forwarded_for="203.0.113.8") == 200
    # A peer that is not the proxy (another container on the network) is taken at its own address.
    direct = _client(compose_web, "127.0.0.5")
    assert [_login(direct, operator, "wrong", forwarded_for=f"198.51.100.{i}") for i in range(3)] == [401] * 3
    assert _login(direct, operator, PASSWORD, forwarded_for="198.51.100.99") == 429


def test_the_proxy_chain_is_read_from_the_right(compose_web: str, operator: str) -> None:
    # A client sending its own header through a proxy that appends: the rightmost address not a proxy's is the
    # client's (uvicorn's ProxyHeadersMiddleware), never the leftmost the client wrote.
    via_proxy = _client(compose_web, PROXY)
    for i in range(3):
        assert _login(via_proxy, operator, "wrong", forwarded_for=f"10.9.9.{i}, 203.0.113.50") == 401
    assert _login(via_proxy, operator, PASSWORD, forwarded_for="10.9.9.77, 203.0.113.50") == 429


def test_compose_runs_the_command_tested_here(tmp_path: Path) -> None:
    web = _rendered(tmp_path)["services"]["web"]
    assert "--proxy-headers" in web["command"] and not any("forwarded-allow-ips" in a for a in web["command"])
