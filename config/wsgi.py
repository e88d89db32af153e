"""WSGI entry point (admin and control-plane API only; the gateway needs ASGI for streaming)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
application = get_wsgi_application()
