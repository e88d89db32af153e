"""The admin login (internal listener) is throttled like the console login, sharing its failure count."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


class InternalClient(Client):
    """A client of the internal listener's URL map (where the admin lives)."""

    def request(self, **request: object):  # type: ignore[no-untyped-def, override]
        with override_settings(ROOT_URLCONF="config.internal_urls"):
            return super().request(**request)


@pytest.fixture
def internal() -> Client:
    return InternalClient()


@override_settings(QUIVER_LOGIN_MAX_FAILURES=3, QUIVER_LOGIN_MAX_FAILURES_PER_IP=100)
def test_admin_login_is_throttled_before_the_password_is_checked(internal: Client) -> None:
    User.objects.create_user(username="root", password="right-password", is_staff=True, is_superuser=True)
    for _ in range(3):
        assert internal.post("/admin/login/", {"username": "root", "password": "wrong"}).status_code == 200
    # Even the right password is refused now, with how long to wait.
    blocked = internal.post("/admin/login/", {"username": "root", "password": "right-password"})
    assert blocked.status_code == 429 and int(blocked["Retry-After"]) > 0
    assert "_auth_user_id" not in internal.session


@override_settings(QUIVER_LOGIN_MAX_FAILURES=2, QUIVER_LOGIN_MAX_FAILURES_PER_IP=100)
def test_console_and_admin_share_the_count(internal: Client) -> None:
    from rest_framework.test import APIClient

    User.objects.create_user(username="op", password="pw-right", is_staff=True)
    console = APIClient()
    assert console.post("/api/v1/auth/login", {"username": "op", "password": "x"}, format="json").status_code == 401
    assert internal.post("/admin/login/", {"username": "op", "password": "x"}).status_code == 200
    assert internal.post("/admin/login/", {"username": "op", "password": "pw-right"}).status_code == 429
    assert console.post("/api/v1/auth/login", {"username": "op", "password": "pw-right"},
                        format="json").status_code == 429


def test_a_good_admin_login_clears_the_count(internal: Client) -> None:
    User.objects.create_user(username="op2", password="pw-right", is_staff=True)
    assert internal.post("/admin/login/", {"username": "op2", "password": "x"}).status_code == 200
    ok = internal.post("/admin/login/", {"username": "op2", "password": "pw-right", "next": "/admin/"})
    assert ok.status_code == 302
    from tenants.models import LoginFailure

    assert not LoginFailure.objects.filter(username="op2").exists()
    assert internal.get("/admin/login/").status_code in (200, 302)
