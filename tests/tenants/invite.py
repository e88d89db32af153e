"""Test helper: an owner's invitation, accepted by the invited user's own console session (tenants.invitations)."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient


def invite_and_accept(owner: APIClient, invitee: Any, role: str = "member") -> dict[str, Any]:
    """``owner`` invites ``invitee`` (a User) with ``role``; a session of ``invitee`` accepts. Returns ``me``."""
    sent = owner.post("/api/v1/members", {"username": invitee.username, "role": role}, format="json")
    assert sent.status_code == 202, sent.content
    session = APIClient()
    session.force_login(invitee)
    pending = [i for i in session.get("/api/v1/auth/invitations").json() if i["id"] == sent.json()["invitation"]["id"]]
    assert pending, "the invitee does not see the invitation"
    accepted = session.post(f"/api/v1/auth/invitations/{pending[0]['id']}/accept")
    assert accepted.status_code == 200, accepted.content
    return accepted.json()
