"""ASGI entry point of the internal listener: ``uvicorn config.internal_asgi:application --port 8001``.

Serves ``config.internal_urls`` only (node heartbeats, admin). Never publish its port; node agents'
``QUIVER_CONTROL_URL`` points here. Settings default to production, as in ``config.asgi``.
"""

import gc
import os

from django.conf import settings

from config.sync_handler import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
if not settings.configured:  # this server's own settings load below (not a test importing it in-process)
    os.environ.setdefault("QUIVER_DB_POOL", "true")  # many short requests on threads: settings.base.pooled
django_application = get_asgi_application()

from config.front_door import FrontDoor  # noqa: E402
from config.listener import InternalListener  # noqa: E402

application = FrontDoor(InternalListener(django_application))

gc.collect()
gc.freeze()  # as in config.asgi: start-up's objects stay out of the cyclic GC's full collections
