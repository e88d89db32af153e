"""Local development and the README demo: SQLite by default, everything overridable from env.

Secrets fall back to fixed development values only while DEBUG is on (the default here); with
``DJANGO_DEBUG=false`` they are required as in production. The demo passes random ones explicitly.
"""

from config.settings.base import *  # noqa: F403
from config.settings.base import read_secret

DEBUG = env.bool("DJANGO_DEBUG", default=True)  # noqa: F405


def _dev(value: str) -> str | None:
    # "dev-insecure" is a placeholder marker: production refuses these values if someone copies them there.
    return value if DEBUG else None


SECRET_KEY = read_secret("DJANGO_SECRET_KEY", dev_default=_dev("dev-insecure-local-secret-key-never-deploy"))
QUIVER_API_KEY_HMAC_KEY = read_secret("QUIVER_API_KEY_HMAC_KEY", dev_default=_dev("dev-insecure-local-api-key-hmac"))
QUIVER_NODE_SECRET = read_secret("QUIVER_NODE_SECRET", dev_default=_dev("dev-insecure-local-node-secret"))
