from django.urls import path

from inference.gateway import views

urlpatterns = [
    path("v1/completions", views.completions),
    path("v1/chat/completions", views.chat_completions),
    path("v1/models", views.models),
    path("v1/models/<path:model_id>", views.model_detail),
]
