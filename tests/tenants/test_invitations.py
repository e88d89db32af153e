"""Membership by consent (issue 30 point 6): an owner's ``POST /api/v1/members`` is an invitation the user accepts.

The attack round: any owner could add any existing user to their tenant without the user's consent; the answer
(400 ``user_not_found`` or 201) told whether a username existed; and the victim's console session broke, having
two tenants to pick from. Now known and unknown usernames get the same answer, nobody becomes a member without
accepting, and accepting keeps the session's tenant.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tenants.models import Invitation, Membership
from tests.factories import TenantFactory
from tests.tenants.invite import invite_and_accept

pytestmark = pytest.mark.django_db


def _session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _shape(body: dict[str, Any]) -> dict[str, Any]:
    """The answer with what legitimately differs between two invitations (the name echoed, ids, times) blanked."""
    invitation = {k: v for k, v in body["invitation"].items() if k not in ("id", "created_at", "expires_at")}
    return {"detail": body["detail"].replace(invitation["username"], "<u>"), "code": body["code"],
            "invitation": {**invitation, "username": "<u>"}}


def test_known_and_unknown_usernames_get_the_same_answer(make_session_client: Any) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    User.objects.create_user(username="victim", password="pw-not-used")
    known = owner.post("/api/v1/members", {"username": "victim", "role": "owner"}, format="json")
    unknown = owner.post("/api/v1/members", {"username": "nobody-here", "role": "owner"}, format="json")
    assert known.status_code == unknown.status_code == 202
    assert _shape(known.json()) == _shape(unknown.json())
    assert set(known.headers) == set(unknown.headers)
    # Both are listed as pending the same way; neither is a member.
    pending = owner.get("/api/v1/invitations").json()
    assert sorted(i["username"] for i in pending) == ["nobody-here", "victim"]
    assert owner.get("/api/v1/members/victim").status_code == 404
    assert not Membership.objects.filter(tenant=tenant, user__username="victim").exists()


def test_nobody_joins_without_accepting_and_the_session_keeps_its_tenant(make_session_client: Any) -> None:
    attacker, attacker_tenant, _ = make_session_client(role="owner")
    victim_client, home, victim = make_session_client(role="owner")
    assert victim_client.get("/api/v1/adapters").status_code == 200  # one tenant: chosen implicitly
    assert attacker.post("/api/v1/members", {"username": victim.username}, format="json").status_code == 202
    # Invited, not added: the victim's console works exactly as before.
    assert victim_client.get("/api/v1/adapters").status_code == 200
    assert [t["slug"] for t in victim_client.get("/api/v1/auth/me").json()["tenants"]] == [home.slug]
    # They see the invitation, and declining it leaves nothing behind.
    (invitation,) = victim_client.get("/api/v1/auth/invitations").json()
    assert (invitation["tenant"], invitation["role"]) == (attacker_tenant.slug, "member")
    assert victim_client.post(f"/api/v1/auth/invitations/{invitation['id']}/decline").status_code == 204
    assert victim_client.get("/api/v1/auth/invitations").json() == []
    assert attacker.get("/api/v1/invitations").json() == []
    assert victim_client.post(f"/api/v1/auth/invitations/{invitation['id']}/accept").status_code == 404


def test_accepting_joins_with_the_offered_role_and_keeps_the_chosen_tenant(make_session_client: Any) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    invitee_client, home, invitee = make_session_client(role="owner")
    me = invite_and_accept(owner, invitee, role="viewer")
    assert {t["slug"]: t["role"] for t in me["tenants"]} == {home.slug: "owner", tenant.slug: "viewer"}
    assert me["tenant"] == home.slug  # the tenant acted in before stays chosen: no "pick a tenant" break
    assert owner.get(f"/api/v1/members/{invitee.username}").json()["role"] == "viewer"
    assert owner.get("/api/v1/invitations").json() == []


def test_an_invitation_is_only_its_addressees(make_session_client: Any) -> None:
    owner, _, _ = make_session_client(role="owner")
    User.objects.create_user(username="bob", password="pw-not-used")
    invitation_id = owner.post("/api/v1/members", {"username": "bob"}, format="json").json()["invitation"]["id"]
    mallory = User.objects.create_user(username="mallory", password="pw-not-used")
    thief = _session(mallory)
    assert thief.get("/api/v1/auth/invitations").json() == []
    for verb in ("accept", "decline"):
        answer = thief.post(f"/api/v1/auth/invitations/{invitation_id}/{verb}")
        assert answer.status_code == 404 and answer.json()["code"] == "invitation_not_found"
    assert Invitation.objects.filter(pk=invitation_id).exists()
    assert APIClient().get("/api/v1/auth/invitations").status_code in (401, 403)


def test_only_owners_invite_and_cancel(make_session_client: Any) -> None:
    owner, tenant, _ = make_session_client(role="owner")
    member = _session(User.objects.create_user(username="m1", password="pw-not-used"))
    Membership.objects.create(tenant=tenant, user=User.objects.get(username="m1"), role="member")
    assert member.post("/api/v1/members", {"username": "x"}, format="json").status_code == 403
    invitation_id = owner.post("/api/v1/members", {"username": "x"}, format="json").json()["invitation"]["id"]
    assert member.delete(f"/api/v1/invitations/{invitation_id}").status_code == 403
    assert owner.delete(f"/api/v1/invitations/{invitation_id}").status_code == 204
    assert owner.get("/api/v1/invitations").json() == []
    # Inviting an existing member says so (the owner lists members anyway).
    assert owner.post("/api/v1/members", {"username": "m1"}, format="json").status_code == 409


def test_a_user_with_no_tenant_lands_in_the_one_accepted() -> None:
    tenant = TenantFactory()
    owner_user = User.objects.create_user(username="boss", password="pw-not-used")
    Membership.objects.create(tenant=tenant, user=owner_user, role="owner")
    newcomer = User.objects.create_user(username="newcomer", password="pw-not-used")
    me = invite_and_accept(_session(owner_user), newcomer)
    assert me["tenant"] == tenant.slug
