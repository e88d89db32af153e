"""Console sessions: ``/api/v1/auth/login``, ``logout``, ``me``, ``session`` and ``tenant`` (pick the tenant to act in).

Django sessions with CSRF on every unsafe call (login included, against login CSRF); passwords are checked by
Django's hashers; failed logins are throttled per username and address (``tenants.login_throttle``).
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth import authenticate, login, logout
from django.contrib.auth.models import User
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.echo import clip
from common.exceptions import QuiverError
from tenants import login_throttle
from tenants.access import SESSION_TENANT_KEY, tenant_choices
from tenants.models import Membership


class LoginInputSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/auth/login``."""
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=512, trim_whitespace=False)


class TenantChoiceSerializer(serializers.Serializer):
    """A tenant the user may act in, with their role there."""
    slug = serializers.CharField()
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MeSerializer(serializers.Serializer):
    """Output of ``GET /api/v1/auth/me``: the user, the tenants they may act in and the one chosen (or null)."""
    username = serializers.CharField()
    email = serializers.CharField(allow_blank=True)
    is_staff = serializers.BooleanField()
    tenants = TenantChoiceSerializer(many=True)
    tenant = serializers.CharField(allow_null=True)


class SessionSerializer(serializers.Serializer):
    """Output of ``GET /api/v1/auth/session``: whether a console session is logged in, and its ``me`` (else null)."""
    authenticated = serializers.BooleanField()
    me = MeSerializer(allow_null=True)


class TenantPickSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/auth/tenant``: a slug from ``me.tenants``."""
    tenant = serializers.CharField(max_length=40)


def me_body(request: Request, user: User) -> dict[str, Any]:
    """The ``me`` document for ``user``; the chosen tenant is the session's, else their only one."""
    choices = tenant_choices(user)
    current = request.session.get(SESSION_TENANT_KEY)
    slugs = [t.slug for t, _ in choices]
    if current not in slugs:
        current = slugs[0] if len(slugs) == 1 else None
    return {
        "username": user.get_username(),
        "email": getattr(user, "email", "") or "",
        "is_staff": bool(getattr(user, "is_staff", False)),
        "tenants": [{"slug": t.slug, "name": t.name, "role": role} for t, role in choices],
        "tenant": current,
    }


class _SessionView(APIView):
    authentication_classes = [SessionAuthentication]


@method_decorator(csrf_protect, name="dispatch")
class LoginView(_SessionView):
    """``POST /api/v1/auth/login``: start a session. 401 wrong credentials, 400 a malformed body, 429 with ``Retry-After`` when throttled."""

    permission_classes = [AllowAny]

    @extend_schema(request=LoginInputSerializer, responses=MeSerializer)
    def post(self, request: Request) -> Response:
        """Check the password (Django's hashers), then log in and return ``me``."""
        data = LoginInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        username, password = data.validated_data["username"], data.validated_data["password"]
        ip = request.META.get("REMOTE_ADDR")
        try:
            login_throttle.login_throttle_check(username=username, ip=ip)
        except login_throttle.LoginThrottled as exc:
            response = Response({"detail": f"Too many failed logins; try again in {exc.retry_after} s.",
                                 "code": "login_throttled"}, status=status.HTTP_429_TOO_MANY_REQUESTS)
            response["Retry-After"] = str(exc.retry_after)
            return response
        user = authenticate(request._request, username=username, password=password)
        if user is None:
            login_throttle.login_failure_record(username=username, ip=ip)
            # 401 as for any failed authentication (RFC 9110 §15.5.2; DRF's NotAuthenticated/AuthenticationFailed);
            # a 400 would say the request was malformed. The console shows ``detail`` either way.
            raise QuiverError("Wrong username or password.", code="invalid_credentials", status_code=401,
                              fields={"password": ["Wrong username or password."]})
        login_throttle.login_failures_clear(username=username, ip=ip)
        login(request._request, user)  # rotates the session key and the CSRF token
        return Response(me_body(request, user))


@method_decorator(csrf_protect, name="dispatch")
class LogoutView(_SessionView):
    """``POST /api/v1/auth/logout``: end the session (204, also when none was open)."""

    permission_classes = [AllowAny]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request) -> Response:
        """Flush the session."""
        logout(request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


@method_decorator(ensure_csrf_cookie, name="dispatch")
class MeView(_SessionView):
    """``GET /api/v1/auth/me``: the logged-in user (401 otherwise); always sets the ``csrftoken`` cookie."""

    permission_classes = [AllowAny]

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        """The ``me`` document, or 401 ``not_authenticated`` (the cookie is set either way, for the login form)."""
        user = request.user
        if user is None or not user.is_authenticated:
            return Response({"detail": "Not logged in.", "code": "not_authenticated"},
                            status=status.HTTP_401_UNAUTHORIZED)
        return Response(me_body(request, user))


@method_decorator(ensure_csrf_cookie, name="dispatch")
class SessionView(_SessionView):
    """``GET /api/v1/auth/session``: the console's start-up probe. Always 200 (so a visitor who has not logged in
    yet causes no failed request), ``{"authenticated": false, "me": null}`` without a session: nothing about any user
    or tenant. Sets the ``csrftoken`` cookie the login form needs. API clients keep ``/auth/me`` and its 401."""

    permission_classes = [AllowAny]

    @extend_schema(responses=SessionSerializer)
    def get(self, request: Request) -> Response:
        """``{"authenticated", "me"}``; never cached (it depends on the session cookie)."""
        user = request.user
        logged_in = user is not None and user.is_authenticated
        me = me_body(request, cast(User, user)) if logged_in else None
        response = Response({"authenticated": logged_in, "me": me})
        response["Cache-Control"] = "no-store"
        return response


class TenantPickView(_SessionView):
    """``POST /api/v1/auth/tenant``: the tenant later calls act in (404 for one the user cannot act in)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=TenantPickSerializer, responses=MeSerializer)
    def post(self, request: Request) -> Response:
        """Store the choice in the session and return ``me``."""
        data = TenantPickSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        slug = data.validated_data["tenant"]
        user = cast(User, request.user)
        if slug not in {t.slug for t, _ in tenant_choices(user)}:
            raise QuiverError(f"No tenant '{clip(slug)}' among yours.", code="tenant_not_found", status_code=404)
        request.session[SESSION_TENANT_KEY] = slug
        return Response(me_body(request, user))
