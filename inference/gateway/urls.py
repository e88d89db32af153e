from django.urls import path, re_path

from inference.gateway import views

# POST /v1/completions and /v1/chat/completions are served in front of Django (config.asgi → inference.gateway.app).
urlpatterns = [
    path("v1/models", views.models),
    path("v1/models/<path:model_id>", views.model_detail),
    re_path(r"^v1/(?P<rest>.*)$", views.unknown_route),
]
