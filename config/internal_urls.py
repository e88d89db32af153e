"""URL map of the internal listener (``config.internal_asgi``): node heartbeats, the admin, a health probe and the
gateway's Prometheus ``/metrics``."""

from django.contrib import admin
from django.urls import path

from config.urls import handler400, handler403, handler404, handler500, healthz
from inference.fleet import internal_views
from inference.gateway import views as gateway_views
from tenants.admin_login import admin_login

urlpatterns = [
    path("internal/v1/nodes/heartbeat", internal_views.heartbeat),
    path("admin/login/", admin_login),  # throttled like the console login
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    path("metrics", gateway_views.metrics),
]

__all__ = ["urlpatterns", "handler400", "handler403", "handler404", "handler500"]
