"""Production: PostgreSQL, Redis, S3. Every secret is required, refused when it is a placeholder or short, and
the API-key HMAC key must differ from ``DJANGO_SECRET_KEY`` (rotating one must not revoke the other's users)."""

from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import PLACEHOLDER_MARKERS, pooled, read_secret

DEBUG = False

# Every variable production cannot start without, checked together first: a fresh machine learns the whole list from
# one try (manage.py prints it as one line), not one name per start.
REQUIRED_ENV = ("DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY", "QUIVER_NODE_SECRET", "DATABASE_URL",
                "CELERY_BROKER_URL")
_missing = [name for name in REQUIRED_ENV if not env.str(name, default="")]  # noqa: F405
if _missing:
    raise ImproperlyConfigured(
        f"{', '.join(_missing)} {'is' if len(_missing) == 1 else 'are'} not set, and the production settings (the "
        "default) need them: give this process the web service's environment (README, 'Using it'; for the running "
        "demo: `set -a; . .cache/demo-run/env; set +a`), or set DJANGO_SETTINGS_MODULE=config.settings.local for a "
        "local SQLite stack with development secrets.")
SECRET_KEY = read_secret("DJANGO_SECRET_KEY")
QUIVER_API_KEY_HMAC_KEY = read_secret("QUIVER_API_KEY_HMAC_KEY")
if QUIVER_API_KEY_HMAC_KEY == SECRET_KEY:
    raise ImproperlyConfigured("QUIVER_API_KEY_HMAC_KEY must differ from DJANGO_SECRET_KEY, so that rotating the "
                               "secret key does not revoke every API key; generate a separate random value.")
QUIVER_NODE_SECRET = read_secret("QUIVER_NODE_SECRET")
DATABASES = {"default": pooled(env.db("DATABASE_URL"))}  # noqa: F405
CELERY_BROKER_URL = env("CELERY_BROKER_URL")  # noqa: F405
AWS_S3_ENDPOINT_URL = env("AWS_S3_ENDPOINT_URL", default=None)  # noqa: F405

# Secrets inside other settings (database password, S3 secret): refuse .env.example's placeholders too.
for _name, _value in (("DATABASE_URL password", urlsplit(env("DATABASE_URL")).password or ""),  # noqa: F405
                      ("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY or "")):  # noqa: F405
    if any(marker in _value.lower() for marker in PLACEHOLDER_MARKERS):
        raise ImproperlyConfigured(f"{_name} is a placeholder (as in .env.example); set a real secret.")

# TLS ends at the reverse proxy (docker-compose: Caddy). Its X-Forwarded-Proto is trusted only when the operator says
# the app is reachable through that proxy alone; otherwise any client could claim https.
if env.bool("QUIVER_BEHIND_TLS_PROXY", default=False):  # noqa: F405
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31_536_000)  # noqa: F405
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
