"""``manage.py quiver_user_create``: a weak password is refused with a one-line fix and no user is written; a strong
one logs in."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("password", ["x", "password1234", "123456789012345"])
def test_a_weak_password_is_refused_before_anything_is_written(password: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_USER_PASSWORD", password)
    with pytest.raises(CommandError, match="QUIVER_USER_PASSWORD is too weak: .* Choose a longer"):
        call_command("quiver_user_create", "bob", "--staff", stdout=io.StringIO())
    assert not User.objects.filter(username="bob").exists()


def test_a_strong_password_makes_a_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_USER_PASSWORD", "plum-Harbour-47-kite")
    call_command("quiver_user_create", "bob", "--staff", stdout=io.StringIO())
    assert authenticate(username="bob", password="plum-Harbour-47-kite") is not None
