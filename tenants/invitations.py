"""Membership by consent: an owner invites a username, and that user accepts (or declines) in the console.

Owners used to add any existing user directly: without the user's consent, telling the owner whether the username
existed (400 ``user_not_found``), and breaking the user's console session, which then had to pick a tenant (attack
round, issue 30 point 6). Now ``POST /api/v1/members`` stores an invitation keyed by the username as typed and
answers the same for a username that exists and one that does not; the user sees it under
``GET /api/v1/auth/invitations`` and becomes a member only by accepting it. GitHub organisations and Slack
workspaces work the same way (a member is added by accepting an invitation:
https://docs.github.com/en/organizations/managing-membership-in-your-organization/inviting-users-to-join-your-organization).
Operators still attach users directly (``manage.py quiver_user_create --tenant``).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from tenants.models import Invitation, Membership, Tenant
from tenants.services import membership_create

INVITATION_TTL = timedelta(days=14)
# Pending invitations a tenant may hold at once: each is a row, and owners could otherwise write them without end.
MAX_PENDING_PER_TENANT = 200


def _pending(queryset: QuerySet[Invitation]) -> QuerySet[Invitation]:
    return queryset.filter(expires_at__gt=timezone.now())


def invitation_create(tenant: Tenant, *, username: str, role: str, actor: User | None) -> Invitation:
    """Invite ``username`` to ``tenant`` with ``role`` (again: a pending invitation is renewed with the new role).

    Nothing here depends on whether ``username`` names a user, so the caller's answer cannot tell.

    Raises:
        common.exceptions.QuiverError: 409 ``member_exists`` (already a member: the owner sees members anyway), 403
            ``quota_exceeded`` past ``MAX_PENDING_PER_TENANT`` pending invitations.
        django.core.exceptions.ValidationError: an unknown role.
    """
    from common.exceptions import QuiverError

    if Membership.objects.filter(tenant=tenant, user__username=username).exists():
        raise QuiverError("Already a member; change the role instead.", code="member_exists", status_code=409)
    now = timezone.now()
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()  # serialises the quota count
        Invitation.objects.filter(tenant=tenant, expires_at__lte=now).delete()
        existing = Invitation.objects.filter(tenant=tenant, username=username).first()
        if existing is None and Invitation.objects.filter(tenant=tenant).count() >= MAX_PENDING_PER_TENANT:
            raise QuiverError(f"This tenant has {MAX_PENDING_PER_TENANT} pending invitations; cancel some first.",
                              code="quota_exceeded", status_code=403)
        invitation = existing or Invitation(tenant=tenant, username=username)
        invitation.role, invitation.invited_by, invitation.expires_at = role, actor, now + INVITATION_TTL
        invitation.full_clean(validate_unique=False)
        invitation.save()
    return invitation


def invitations_of_tenant(tenant: Tenant) -> QuerySet[Invitation]:
    """The tenant's pending invitations, newest first."""
    return _pending(Invitation.objects.filter(tenant=tenant)).select_related("invited_by").order_by("-created_at")


def invitations_for_user(user: User) -> QuerySet[Invitation]:
    """The pending invitations addressed to ``user``'s username, oldest first."""
    return _pending(Invitation.objects.filter(username=user.get_username())).select_related(
        "tenant", "invited_by").order_by("created_at")


def invitation_cancel(tenant: Tenant, *, invitation_id: int) -> None:
    """Withdraw a pending invitation of ``tenant``.

    Raises:
        Invitation.DoesNotExist: none with that id in this tenant (another tenant's is not found either).
    """
    Invitation.objects.get(tenant=tenant, pk=invitation_id).delete()


def invitation_accept(user: User, *, invitation_id: int) -> Membership:
    """Make ``user`` a member with the invitation's role, and drop the invitation.

    Raises:
        Invitation.DoesNotExist: no pending invitation with that id for this user's username (someone else's is not
            found either).
    """
    with transaction.atomic():
        invitation = invitations_for_user(user).select_for_update(of=("self",)).get(pk=invitation_id)
        tenant, role = invitation.tenant, invitation.role
        invitation.delete()
        existing = Membership.objects.filter(tenant=tenant, user=user).first()
        if existing is not None:  # added meanwhile (an operator): keep that role
            return existing
        try:
            with transaction.atomic():
                return membership_create(tenant, user=user, role=role)
        except IntegrityError:  # a concurrent accept of a second invitation to the same tenant won
            return Membership.objects.get(tenant=tenant, user=user)


def invitation_decline(user: User, *, invitation_id: int) -> None:
    """Refuse an invitation: it is dropped, and the tenant's owners see it no longer pending.

    Raises:
        Invitation.DoesNotExist: no pending invitation with that id for this user.
    """
    invitations_for_user(user).get(pk=invitation_id).delete()
