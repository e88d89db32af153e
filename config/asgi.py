"""ASGI entry point served by uvicorn: the control-plane API and the streaming OpenAI-compatible gateway.

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
django_application = get_asgi_application()

from config.front_door import FrontDoor  # noqa: E402  (needs settings configured)

# Body caps and credential checks happen before Django reads (and spools) a request body.
application = FrontDoor(django_application)
