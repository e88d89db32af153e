"""WSGI entry point (admin and control-plane API only; the gateway needs ASGI for streaming).

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_wsgi_application()
