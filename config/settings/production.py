"""Production: PostgreSQL, Redis, S3; required secrets have no default so a missing one fails at start-up."""

from config.settings.base import *  # noqa: F403

SECRET_KEY = env("DJANGO_SECRET_KEY")  # noqa: F405
QUIVER_API_KEY_HMAC_KEY = env("QUIVER_API_KEY_HMAC_KEY", default=SECRET_KEY)  # noqa: F405
DATABASES = {"default": env.db("DATABASE_URL")}  # noqa: F405
CELERY_BROKER_URL = env("CELERY_BROKER_URL")  # noqa: F405
AWS_S3_ENDPOINT_URL = env("AWS_S3_ENDPOINT_URL", default=None)  # noqa: F405
QUIVER_NODE_KEY = env("QUIVER_NODE_KEY")  # noqa: F405
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
