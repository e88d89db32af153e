"""ASGI entry point served by uvicorn: the control-plane API and the streaming OpenAI-compatible gateway."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
application = get_asgi_application()
