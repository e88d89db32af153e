"""Members are addressed by username, and Django usernames may hold ``.``, ``@``, ``+`` and ``-`` (email-style
names): an owner must be able to change and remove every member, and another tenant's member is a 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.tenants.invite import invite_and_accept

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("username", ["john.doe", "ops@example.com", "a+b", "x-y_z"])
def test_owner_changes_and_removes_members_with_any_django_username(make_session_client: Any, username: str) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    invite_and_accept(owner, User.objects.create_user(username=username, password="pw-not-used"))
    assert owner.get(f"/api/v1/members/{username}").json()["username"] == username
    assert owner.patch(f"/api/v1/members/{username}", {"role": "viewer"}, format="json").status_code == 200
    assert owner.delete(f"/api/v1/members/{username}").status_code == 204
    assert owner.get(f"/api/v1/members/{username}").status_code == 404


def test_another_tenants_dotted_member_is_a_404(make_session_client: Any) -> None:
    owner_a, _, _ = make_session_client(role="owner")
    owner_b, _, _ = make_session_client(role="owner")
    invite_and_accept(owner_a, User.objects.create_user(username="jane.roe", password="pw-not-used"))
    for call in (owner_b.get, owner_b.delete):
        assert call("/api/v1/members/jane.roe").status_code == 404
    assert owner_b.patch("/api/v1/members/jane.roe", {"role": "owner"}, format="json").status_code == 404
