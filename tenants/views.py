"""API keys and members of the calling tenant.

Keys: list, create (secret shown once), revoke. Console members see and revoke only the keys they created and cannot
grant ``keys:manage``; owners (and keys with ``keys:manage``) manage every key of the tenant.
Members: owners invite users by username (the user accepts in the console: ``tenants.invitations``), change roles
and remove members; everyone in the tenant may list members and pending invitations.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.echo import clip
from common.exceptions import QuiverError
from tenants import invitations, services
from tenants.models import LIMIT_FIELDS, ApiKey, Invitation, Membership, Tenant
from tenants.scopes import ALL_SCOPES, KEYS_MANAGE
from tenants.serializers import (
    ApiKeyCreatedSerializer,
    ApiKeyInputSerializer,
    ApiKeyOutputSerializer,
    LimitsSerializer,
)
from tenants.viewsets import TenantScopedViewSet

ALL_METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
KEYS_SCOPE_MAP = {m: KEYS_MANAGE for m in ALL_METHODS}
KEYS_ROLE_MAP = {m: Membership.Role.MEMBER for m in ALL_METHODS}
MEMBERS_ROLE_MAP = {**{m: Membership.Role.OWNER for m in ALL_METHODS}, "GET": Membership.Role.VIEWER,
                    "HEAD": Membership.Role.VIEWER, "OPTIONS": Membership.Role.VIEWER}


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """``/api/v1/api-keys``: the tenant's keys. Keys need scope ``keys:manage``; sessions need role member."""

    queryset = ApiKey.objects.order_by("-created_at")
    serializer_class = ApiKeyOutputSerializer
    lookup_field = "key_id"
    scope_map = KEYS_SCOPE_MAP
    role_map = KEYS_ROLE_MAP

    def tenant_queryset(self, queryset: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
        """Members see only the keys they created; owners and ``keys:manage`` keys see all, except that a key limited
        to some adapters sees only keys limited to some of those (the others would name adapters it cannot see)."""
        access = self.principal
        if access.user is not None and not access.has_role(Membership.Role.OWNER):
            return queryset.filter(created_by=access.user)
        names = self.key_adapter_names
        if names is not None:
            within = [k.pk for k in queryset.only("pk", "adapters") if k.adapters and k.adapter_names <= names]
            return queryset.filter(pk__in=within)
        return queryset

    @extend_schema(request=ApiKeyInputSerializer, responses={201: ApiKeyCreatedSerializer})
    def create(self, request: Request) -> Response:
        """``POST /api/v1/api-keys``: 201 with ``secret`` shown this once; scopes at most the caller's. ``adapters``
        naming no adapter or version of the tenant yet are kept and listed in ``adapters_not_found`` (with a
        ``warning`` sentence): a key may be made before the adapters it will call."""
        data = ApiKeyInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # Limits may be set at creation (they were dropped without a word: attack round); any other field is named.
        known = set(ApiKeyInputSerializer().fields)
        extra = sorted(set(request.data) - known) if isinstance(request.data, dict) else []
        if extra:
            raise serializers.ValidationError({clip(extra[0]): f"Unknown field; a key takes {sorted(known)}."})
        fields = dict(data.validated_data)
        asked = {name: fields.pop(name) for name in LIMIT_FIELDS if name in fields}
        access = self.principal
        grantable = None
        limits: dict[str, Any] = {k: v for k, v in asked.items() if v is not None}
        if access.user is not None and not access.has_role(Membership.Role.OWNER):
            grantable = [s for s in ALL_SCOPES if s != KEYS_MANAGE]
            # What an owner set on this member's keys binds the keys they mint next (attack-round finding).
            limits = services.limits_tightest(limits, services.member_key_limits(self.tenant, user=access.user))
        if "scopes" not in fields:
            # "All yours": what the caller may grant, not every scope (a member asking for a key by name alone got a
            # 400 for keys:manage, which they never asked for; found by a fresh user).
            fields["scopes"] = [s for s in ALL_SCOPES if (grantable is None or s in grantable)
                                and (access.api_key is None or s in access.api_key.scopes)]
        key, plaintext = services.api_key_create(self.tenant, granted_by=access.api_key, actor=access.user,  # type: ignore[arg-type]
                                                 grantable=grantable, limits=limits, **fields)
        # A name that exists nowhere yet is kept (the key may be for an adapter still to come) but said, so a typo
        # is not a key that 404s everything in silence.
        missing = services.adapters_not_found(self.tenant, key.adapters)
        body = {**ApiKeyOutputSerializer(key).data, "secret": plaintext, "adapters_not_found": missing,
                "warning": services.adapters_not_found_warning(missing)}
        return Response(body, status=status.HTTP_201_CREATED)

    # The request is the limits alone (the schema said the key's output fields, so typed clients could not send them).
    @extend_schema(request=LimitsSerializer, responses=ApiKeyOutputSerializer)
    def partial_update(self, request: Request, key_id: str | None = None) -> Response:
        """``PATCH /api/v1/api-keys/{key_id}``: set the key's gateway limits (``rpm_limit``, ``tpm_limit``,
        ``concurrency_limit``, ``max_tokens_limit``; null = unlimited); the tenant's limits still apply."""
        key = self.get_object()
        data = LimitsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        extra = sorted(set(request.data) - set(LIMIT_FIELDS)) if isinstance(request.data, dict) else []
        if extra:
            raise serializers.ValidationError({clip(extra[0]): f"Only limits can be changed: {list(LIMIT_FIELDS)}."})
        access = self.principal
        if access.api_key is not None and access.api_key.pk != key.pk:
            # As for revoking: a limited keys:manage key set rpm_limit 1 on the owner's unlimited key (attack round).
            stronger = _stronger(key, access.api_key)
            if stronger:
                raise QuiverError(f"This key cannot change the limits of a key stronger than itself ({stronger}); use "
                                  "an owner's console session or a key at least as strong.", code="key_stronger",
                                  status_code=403)
        if access.api_key is not None:
            # A key never sets a limit looser than its own, on itself or another key (attack round: a limited
            # keys:manage key cleared its own limits and its children's).
            # A key without a priority class of its own ranks as its tenant does (the gateway caps every key
            # there), so it may set any class; one with a class may not set a higher one.
            asked = {k: v for k, v in data.validated_data.items()
                     if k != "priority_class" or access.api_key.priority_class is not None}
            over = services.limits_loosened(access.api_key, asked)
            if over:
                raise QuiverError(f"This key cannot set '{over}' looser than its own; an owner can, from the console "
                                  "or with an unlimited key.", code="limit_owner_only", status_code=403)
        owner = access.acts_as_owner()
        if not owner:
            loosened = services.limits_loosened(key, data.validated_data)
            if loosened:
                raise QuiverError(f"Only an owner can raise or clear '{loosened}' on a key; you may only tighten it.",
                                  code="limit_owner_only", status_code=403)
        services.limits_set(key, limits=data.validated_data)
        if owner:  # an owner's word on a member's key also binds the keys that member mints later
            services.member_key_limits_note(self.tenant, key=key, limits=data.validated_data)
        return Response(ApiKeyOutputSerializer(key).data)

    @extend_schema(request=None, responses={201: ApiKeyCreatedSerializer})
    @action(detail=False, methods=["post"])
    def playground(self, request: Request) -> Response:
        """``POST /api/v1/api-keys/playground`` (console sessions, role member): the caller's playground key, an
        ``inference``-only key expiring in an hour, with a new ``secret`` shown this once. One key per user and
        tenant, its secret replaced on each call (``services.playground_key_issue``): the console asks once per tab,
        and the key list does not grow with visits. 403 ``session_only`` for API keys (they call the gateway
        themselves)."""
        access = self.principal
        if access.user is None:
            raise QuiverError("The playground key is for console sessions; an API key calls the gateway itself.",
                              code="session_only", status_code=403)
        limits = ({} if access.has_role(Membership.Role.OWNER)
                  else services.member_key_limits(self.tenant, user=access.user))
        key, plaintext = services.playground_key_issue(self.tenant, actor=access.user, limits=limits)
        body = {**ApiKeyOutputSerializer(key).data, "secret": plaintext, "adapters_not_found": [], "warning": None}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ApiKeyOutputSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, key_id: str | None = None) -> Response:
        """``POST /api/v1/api-keys/{key_id}/revoke``: disable the key for good (idempotent). A key revokes itself or
        keys no stronger than itself (those it could have minted): a limited ``keys:manage`` key revoked the owner's
        unlimited key (attack round)."""
        key = self.get_object()
        caller = self.principal.api_key
        if caller is not None and caller.pk != key.pk:
            stronger = _stronger(key, caller)
            if stronger:
                raise QuiverError(f"This key cannot revoke a key stronger than itself ({stronger}); use an owner's "
                                  "console session or a key at least as strong.", code="key_stronger",
                                  status_code=403)
        key = services.api_key_revoke(self.tenant, key_id=key.key_id)
        return Response(ApiKeyOutputSerializer(key).data)


def _stronger(key: ApiKey, than: ApiKey) -> str | None:
    """Why ``key`` can do more than ``than`` (a scope, an adapter, a looser limit, a later expiry), else None."""
    extra = sorted(set(key.scopes) - set(than.scopes))
    if extra:
        return f"scopes {extra}"
    if than.adapters:
        reach = {str(a) for a in than.adapters}
        wider = [a for a in key.adapters or ["every adapter"] if a not in reach and str(a).partition("@")[0] not in reach]
        if wider:
            return f"adapters {wider}"
    loose = next((name for name in LIMIT_FIELDS if name != "priority_class" and getattr(than, name) is not None
                  and (getattr(key, name) is None or getattr(key, name) > getattr(than, name))), None)
    if loose:
        return f"a looser {loose}"
    if than.expires_at is not None and (key.expires_at is None or key.expires_at > than.expires_at):
        return "a later expiry"
    return None


class TenantLimitsViewSet(TenantScopedViewSet):
    """``/api/v1/tenant/limits``: the tenant's gateway limits. Anyone in the tenant may read them; only operators
    (staff sessions) change them, since they bound what a tenant may take from the shared fleet."""

    queryset = Tenant.objects.all()
    tenant_field = "pk"
    role_map = {**{m: Membership.Role.VIEWER for m in ALL_METHODS}}

    serializer_class = LimitsSerializer  # the schema's request and response shape

    @extend_schema(responses=LimitsSerializer)
    def retrieve(self, request: Request) -> Response:
        """``GET``: ``{"rpm_limit", "tpm_limit", "concurrency_limit", "max_tokens_limit", "priority_class"}`` (null =
        unlimited / the default class)."""
        return Response({name: getattr(self.tenant, name) for name in LIMIT_FIELDS})

    @extend_schema(request=LimitsSerializer, responses=LimitsSerializer)
    def partial_update(self, request: Request) -> Response:
        """``PATCH`` (staff only): set any of the limits."""
        user = self.principal.user
        if user is None or not user.is_staff:
            raise QuiverError("Only operators change a tenant's limits.", code="operator_only", status_code=403)
        data = LimitsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = services.limits_set(self.tenant, limits=data.validated_data)
        return Response({name: getattr(tenant, name) for name in LIMIT_FIELDS})


class MemberOutputSerializer(serializers.ModelSerializer):
    """Output: a member's username, email and role."""
    username = serializers.CharField(source="user.username")
    email = serializers.CharField(source="user.email")

    class Meta:
        model = Membership
        fields = ["username", "email", "role", "created_at"]


class MemberInputSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/members``: the ``username`` to invite and the ``role`` offered."""
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Membership.Role.choices, default=Membership.Role.MEMBER)


class InvitationOutputSerializer(serializers.ModelSerializer):
    """A pending invitation as the tenant sees it: who was invited (as typed), the role offered, by whom, until when."""
    invited_by = serializers.CharField(source="invited_by.username", allow_null=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "username", "role", "invited_by", "created_at", "expires_at"]


class InvitationSentSerializer(serializers.Serializer):
    """Output of ``POST /api/v1/members`` (202): the same for every username, whether or not it has an account."""
    detail = serializers.CharField()
    code = serializers.CharField()
    invitation = InvitationOutputSerializer()


class MemberRoleSerializer(serializers.Serializer):
    """Input of ``PATCH /api/v1/members/{username}``."""
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MemberViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """``/api/v1/members``: who may act in the tenant. Owners write (keys: ``keys:manage``); everyone reads."""

    queryset = Membership.objects.select_related("user").order_by("user__username")
    serializer_class = MemberOutputSerializer
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    # Django usernames may contain '.', '@', '+' (DRF's default lookup regex stops at '.').
    lookup_value_regex = r"[\w.@+-]+"
    scope_map = KEYS_SCOPE_MAP
    role_map = MEMBERS_ROLE_MAP

    @extend_schema(request=MemberInputSerializer, responses={202: InvitationSentSerializer})
    def create(self, request: Request) -> Response:
        """``POST /api/v1/members``: invite a username; 202 whether or not it has an account (nothing tells which),
        and it becomes a member once that user accepts in the console. 409 ``member_exists``."""
        data = MemberInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        username = data.validated_data["username"]
        user = self.principal.user
        invitation = invitations.invitation_create(self.tenant, username=username, role=data.validated_data["role"],
                                                   actor=user)
        body = {"detail": f"Invitation to '{clip(username)}' saved: if that account exists, its holder sees it in "
                          "the console and becomes a member on accepting it.",
                "code": "invitation_sent", "invitation": InvitationOutputSerializer(invitation).data}
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=MemberRoleSerializer, responses=MemberOutputSerializer)
    def partial_update(self, request: Request, username: str | None = None) -> Response:
        """``PATCH /api/v1/members/{username}``: change the role (the last owner stays owner)."""
        data = MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_set_role(self.tenant, membership=self.get_object(),
                                                  role=data.validated_data["role"])
        return Response(MemberOutputSerializer(membership).data)

    def destroy(self, request: Request, username: str | None = None) -> Response:
        """``DELETE /api/v1/members/{username}``: remove the member (not the last owner)."""
        services.membership_delete(self.tenant, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """``/api/v1/invitations``: the tenant's pending invitations; owners cancel them (keys: ``keys:manage``)."""

    queryset = Invitation.objects.all()
    serializer_class = InvitationOutputSerializer
    scope_map = KEYS_SCOPE_MAP
    role_map = MEMBERS_ROLE_MAP

    def tenant_queryset(self, queryset: QuerySet[Invitation]) -> QuerySet[Invitation]:
        """Pending ones only, newest first."""
        return invitations.invitations_of_tenant(self.tenant)

    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """``DELETE /api/v1/invitations/{id}``: withdraw it (204; 404 for none in this tenant)."""
        invitation = self.get_object()
        invitations.invitation_cancel(self.tenant, invitation_id=invitation.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)
