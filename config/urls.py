"""URL map: control-plane API under ``/api/v1/``, the OpenAI-compatible gateway under ``/v1/``."""

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import SimpleRouter

from adapters_app.upload_views import UploadViewSet
from adapters_app.views import AdapterVersionViewSet, AdapterViewSet, BaseModelViewSet
from config.console import console_index
from inference.fleet.api.fleet import (
    OperatorAuditViewSet,
    OperatorPlacementViewSet,
    OperatorQuotaViewSet,
    OperatorVersionViewSet,
    ResidencyViewSet,
)
from inference.fleet.api.operator import OperatorResidencyViewSet, OperatorTrafficViewSet
from inference.fleet.api.registry import NodeRegistryViewSet
from inference.fleet.api.tenants import OperatorTenantViewSet
from inference.metering.api import UsageViewSet
from tenants.auth_views import LoginView, LogoutView, MeView, SessionView, TenantPickView
from tenants.invitation_views import AcceptInvitationView, DeclineInvitationView, MyInvitationsView
from tenants.views import ApiKeyViewSet, InvitationViewSet, MemberViewSet, TenantLimitsViewSet

router = SimpleRouter(trailing_slash=False)
router.register("adapters", AdapterViewSet, basename="adapter")
router.register("base-models", BaseModelViewSet, basename="base-model")
router.register("api-keys", ApiKeyViewSet, basename="api-key")
router.register("usage", UsageViewSet, basename="usage")
router.register("members", MemberViewSet, basename="member")
router.register("invitations", InvitationViewSet, basename="invitation")
router.register("operator/nodes", NodeRegistryViewSet, basename="operator-node")
router.register("operator/versions", OperatorVersionViewSet, basename="operator-version")
router.register("operator/placements", OperatorPlacementViewSet, basename="operator-placement")
router.register("operator/residency", OperatorResidencyViewSet, basename="operator-residency")
router.register("operator/residency-quotas", OperatorQuotaViewSet, basename="operator-residency-quota")
router.register("operator/audit", OperatorAuditViewSet, basename="operator-audit")
router.register("operator/tenants", OperatorTenantViewSet, basename="operator-tenant")
router.register("operator/traffic", OperatorTrafficViewSet, basename="operator-traffic")
router.register("residency", ResidencyViewSet, basename="residency")
router.register(r"adapters/(?P<adapter_name>[a-z0-9-]+)/versions", AdapterVersionViewSet, basename="adapter-version")
router.register(r"adapters/(?P<adapter_name>[a-z0-9-]+)/uploads", UploadViewSet, basename="adapter-upload")


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for load balancers and tests: ``{"ok": true}``."""
    return JsonResponse({"ok": True})


urlpatterns = [
    path("api/v1/auth/login", LoginView.as_view()),
    path("api/v1/auth/logout", LogoutView.as_view()),
    path("api/v1/auth/me", MeView.as_view()),
    path("api/v1/auth/session", SessionView.as_view()),
    path("api/v1/auth/tenant", TenantPickView.as_view()),
    path("api/v1/auth/invitations", MyInvitationsView.as_view()),
    path("api/v1/auth/invitations/<int:invitation_id>/accept", AcceptInvitationView.as_view()),
    path("api/v1/auth/invitations/<int:invitation_id>/decline", DeclineInvitationView.as_view()),
    path("api/v1/tenant/limits", TenantLimitsViewSet.as_view({"get": "retrieve", "patch": "partial_update"})),
    path("api/v1/", include(router.urls)),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="schema"),
    path("healthz", healthz),
    path("", include("inference.gateway.urls")),
    # Everything else is a console route (SPA fallback); API-looking paths keep their JSON 404.
    re_path(r"^(?!api/|v1/|internal/|admin/|static/|healthz|metrics)(?P<path>.*)$", console_index),
]
# Node heartbeats and the admin are on the internal listener (config.internal_urls), not here.
if settings.QUIVER_PUBLIC_ADMIN:
    from tenants.admin_login import admin_login

    urlpatterns[:0] = [path("admin/login/", admin_login), path("admin/", admin.site.urls)]

handler400 = "config.error_views.bad_request"
handler403 = "config.error_views.permission_denied"
handler404 = "config.error_views.not_found"
handler500 = "config.error_views.server_error"
