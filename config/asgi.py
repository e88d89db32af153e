"""ASGI entry point served by uvicorn: the control-plane API and the streaming OpenAI-compatible gateway.

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly. ``POST /v1/completions`` and ``/v1/chat/completions`` go to the
gateway's lean ASGI app (``inference.gateway.app``, no Django request cycle on the hot path); everything else, other
``/v1/*`` paths included, to Django.
"""

import gc
import os

from django.conf import settings

from config.sync_handler import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
if not settings.configured:  # this server's own settings load below (not a test importing it in-process)
    os.environ.setdefault("QUIVER_DB_POOL", "true")  # many short requests on threads: settings.base.pooled
django_application = get_asgi_application()

from adapters_app import storage  # noqa: E402
from config.front_door import FrontDoor  # noqa: E402  (needs settings configured)
from inference.gateway import app as gateway  # noqa: E402
from inference.gateway.guard import OpenAIErrorGuard  # noqa: E402

# Built at start, not in some user's first upload (each boto3 client costs tens of ms of CPU to build).
storage.warm_up()


async def _route(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan" or (scope["type"] == "http" and scope["path"] in gateway.ROUTES):
        await gateway.application(scope, receive, send)
    else:
        await django_application(scope, receive, send)


# Body caps and credential checks happen before Django (or the gateway) reads a request body; outermost, nothing
# under /v1/ answers a non-OpenAI-shaped 5xx.
application = OpenAIErrorGuard(FrontDoor(_route, self_authenticating=frozenset(gateway.ROUTES)))

# What start-up loaded (Django, DRF, boto3...) lives as long as the process: kept out of the cyclic GC, whose full
# collections otherwise walk all ~170,000 objects (about 100 ms of CPU each, seen in scripts/bench_upload).
gc.collect()
gc.freeze()
