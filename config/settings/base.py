"""Settings shared by every environment, read from the environment with django-environ.

Every production-only behaviour is an env switch here (conventions §7); required secrets have no default in
``production.py`` so a missing one fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="dev-insecure-secret-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "tenants",
    "adapters_app",
    "inference.gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The demo's web server and worker share one SQLite file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"

# Uploads above this stay on disk, never whole in memory (Django's TemporaryFileUploadHandler).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
# Non-file bodies (long prompts to the gateway) up to 32 MiB; beyond that Django answers 400 (JSON via handler400).
DATA_UPLOAD_MAX_MEMORY_SIZE = 32 * 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.HasScope"],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "EXCEPTION_HANDLER": "config.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {"TITLE": "Quiver control-plane API", "VERSION": "0.1.0"}

# --- Celery (conventions §8): named queues, bounded time below Redis's visibility timeout.
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Serverless broker for the demo (kombu's filesystem transport; shared/notes/services.md "Celery").
    _queue_dir = env("CELERY_FILESYSTEM_DIR", default=str(BASE_DIR / "var" / "celery"))
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": _queue_dir, "data_folder_out": _queue_dir, "processed_folder": _queue_dir + "-done",
        "store_processed": False, "polling_interval": 0.2, "control_folder": _queue_dir + "-control",
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 600
CELERY_TASK_SOFT_TIME_LIMIT = 540
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ROUTES = {
    "workers.tasks.adapter_version_validate_task": {"queue": "validation"},
    "workers.tasks.placement_warm_task": {"queue": "placement"},
    "workers.tasks.placement_evict_task": {"queue": "placement"},
    "workers.tasks.node_unload_task": {"queue": "placement"},
}
CELERY_BEAT_SCHEDULE = {
    "node-mark-stale": {"task": "workers.tasks.node_mark_stale_task", "schedule": 15.0},
}

# --- S3 (conventions §7: AWS_S3_ENDPOINT_URL points boto3 at the local S3 server).
AWS_S3_ENDPOINT_URL = env("AWS_S3_ENDPOINT_URL", default=None)
AWS_ACCESS_KEY_ID = env("AWS_ACCESS_KEY_ID", default=None)
AWS_SECRET_ACCESS_KEY = env("AWS_SECRET_ACCESS_KEY", default=None)
AWS_STORAGE_BUCKET_NAME = env("AWS_STORAGE_BUCKET_NAME", default="quiver")
AWS_S3_REGION_NAME = env("AWS_S3_REGION_NAME", default="us-east-1")

# --- Quiver
QUIVER_API_KEY_PREFIX = "qv"
QUIVER_API_KEY_HMAC_KEY = env("QUIVER_API_KEY_HMAC_KEY", default=SECRET_KEY)
QUIVER_API_KEY_LAST_USED_INTERVAL_S = 60
QUIVER_MAX_UPLOAD_BYTES = env.int("QUIVER_MAX_UPLOAD_BYTES", default=512 * 1024 * 1024)
QUIVER_MAX_ARCHIVE_MEMBERS = env.int("QUIVER_MAX_ARCHIVE_MEMBERS", default=64)
# Shared secret between the control plane and node agents / vLLM engines; tenants never see it.
QUIVER_NODE_KEY = env("QUIVER_NODE_KEY", default="dev-node-key")
QUIVER_NODE_STALE_AFTER_S = env.int("QUIVER_NODE_STALE_AFTER_S", default=30)
# How long a gateway request waits for a cold adapter to be warmed before answering 503.
QUIVER_WARM_WAIT_S = env.float("QUIVER_WARM_WAIT_S", default=60.0)
QUIVER_PROXY_TIMEOUT_S = env.float("QUIVER_PROXY_TIMEOUT_S", default=300.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
}
