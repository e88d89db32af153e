"""ASGI entry point of the internal listener: ``uvicorn config.internal_asgi:application --port 8001``.

Serves ``config.internal_urls`` only (node heartbeats, admin). Never publish its port; node agents'
``QUIVER_CONTROL_URL`` points here. Settings default to production, as in ``config.asgi``.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
django_application = get_asgi_application()

from config.front_door import FrontDoor  # noqa: E402
from config.listener import InternalListener  # noqa: E402

application = FrontDoor(InternalListener(django_application))
