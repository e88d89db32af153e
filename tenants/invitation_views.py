"""The invited user's side of ``tenants.invitations``: console-session endpoints under ``/api/v1/auth/invitations``.

``GET`` lists the pending invitations addressed to the signed-in user; ``POST …/{id}/accept`` makes the membership
and returns ``me``; ``POST …/{id}/decline`` drops it. Another user's invitation is a 404 like one that never was.
"""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_protect
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.exceptions import QuiverError
from tenants import invitations
from tenants.access import SESSION_TENANT_KEY, tenant_choices
from tenants.auth_views import MeSerializer, me_body
from tenants.models import Invitation, Membership


class MyInvitationSerializer(serializers.Serializer):
    """An invitation as its addressee sees it: which tenant, the role offered, who invited, until when."""
    id = serializers.IntegerField()
    tenant = serializers.CharField(source="tenant.slug")
    tenant_name = serializers.CharField(source="tenant.name")
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    invited_by = serializers.CharField(source="invited_by.username", allow_null=True, default=None)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


_NOT_FOUND = ("No such invitation for you (it may have expired, been cancelled or already answered).",
              "invitation_not_found")


class _InvitationSessionView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]


class MyInvitationsView(_InvitationSessionView):
    """``GET /api/v1/auth/invitations``: the signed-in user's pending invitations, oldest first."""

    @extend_schema(responses=MyInvitationSerializer(many=True))
    def get(self, request: Request) -> Response:
        """The list (``[]`` when none); never cached."""
        rows = invitations.invitations_for_user(cast(User, request.user))
        response = Response(MyInvitationSerializer(rows, many=True).data)
        response["Cache-Control"] = "no-store"
        return response


@method_decorator(csrf_protect, name="dispatch")
class AcceptInvitationView(_InvitationSessionView):
    """``POST /api/v1/auth/invitations/{id}/accept``: join the tenant with the role offered; returns ``me``."""

    @extend_schema(request=None, responses=MeSerializer)
    def post(self, request: Request, invitation_id: int) -> Response:
        """Accept. The tenant the session acted in stays chosen, so joining a second tenant breaks nothing open."""
        user = cast(User, request.user)
        before = [t.slug for t, _ in tenant_choices(user)]
        try:
            membership = invitations.invitation_accept(user, invitation_id=invitation_id)
        except Invitation.DoesNotExist:
            raise QuiverError(_NOT_FOUND[0], code=_NOT_FOUND[1], status_code=404) from None
        session = request.session
        if session.get(SESSION_TENANT_KEY) not in before:
            # The user's only tenant was implicit; with a second one it would no longer be: keep acting there, or,
            # for a user who had none, in the tenant just joined.
            session[SESSION_TENANT_KEY] = before[0] if len(before) == 1 else membership.tenant.slug
        return Response(me_body(request, user))


@method_decorator(csrf_protect, name="dispatch")
class DeclineInvitationView(_InvitationSessionView):
    """``POST /api/v1/auth/invitations/{id}/decline``: refuse it (204)."""

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, invitation_id: int) -> Response:
        """Decline; 404 ``invitation_not_found`` when there is no such pending invitation for this user."""
        try:
            invitations.invitation_decline(cast(User, request.user), invitation_id=invitation_id)
        except Invitation.DoesNotExist:
            raise QuiverError(_NOT_FOUND[0], code=_NOT_FOUND[1], status_code=404) from None
        return Response(status=status.HTTP_204_NO_CONTENT)
