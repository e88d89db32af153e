"""Settings shared by every environment, read from the environment with django-environ.

Every production-only behaviour is an env switch here (conventions §7). Secrets are not read here: each environment
module reads its own with :func:`read_secret`, which has no default outside DEBUG and refuses the placeholders of
``.env.example``, so a missing or copied secret fails at start-up.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from workers import schedule

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()

DEBUG = env.bool("DJANGO_DEBUG", default=False)

# Values that must never guard a deployment: .env.example's "CHANGE-ME-..." and the seed's old public defaults.
PLACEHOLDER_MARKERS = ("change-me", "changeme", "change_me", "replace-me", "dev-node-key", "dev-insecure")
SECRET_MIN_LENGTH = 32


def read_secret(name: str, *, dev_default: str | None = None, min_length: int = SECRET_MIN_LENGTH) -> str:
    """Read secret ``name`` from the environment, refusing placeholders and short values.

    Args:
        name: the environment variable, e.g. ``"DJANGO_SECRET_KEY"``.
        dev_default: value used when the variable is unset; pass it only under DEBUG (local development).
        min_length: shortest accepted value, in characters (32 by default: 192 bits as url-safe base64).

    Returns:
        The secret.

    Raises:
        ImproperlyConfigured: unset (and no ``dev_default``), a placeholder from ``.env.example``, or too short;
            the message names the variable and how to make a good value.
    """
    how = "e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))'"
    value = env.str(name, default="") or dev_default
    if not value:
        raise ImproperlyConfigured(f"{name} is not set; set it to a long random value ({how}).")
    if value != dev_default:
        if any(marker in value.lower() for marker in PLACEHOLDER_MARKERS):
            raise ImproperlyConfigured(f"{name} is a placeholder (as in .env.example); replace it with a long random "
                                       f"value ({how}).")
        if len(value) < min_length:
            raise ImproperlyConfigured(f"{name} has {len(value)} characters; use at least {min_length} ({how}).")
    return value

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
    "inference.metering",
    "inference.fleet",
    "inference.gateway",
]

MIDDLEWARE = [
    "config.listener.ListenerUrlconfMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "config.console.AsyncWhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
CSRF_FAILURE_VIEW = "config.error_views.csrf_failure"
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
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
    # The demo's web server, internal listener and worker share one SQLite file: wait for locks instead of failing.
    # IMMEDIATE takes the write lock when a transaction begins, so a read-then-write transaction waits for the lock
    # instead of failing at once with "database is locked" (SQLite cannot upgrade a read lock while another writes).
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}


def pooled(database: dict[str, Any]) -> dict[str, Any]:
    """``database`` with psycopg's connection pool (Django's ``OPTIONS["pool"]``) when ``QUIVER_DB_POOL`` is on and
    it is PostgreSQL.

    Under ASGI each request runs in a fresh context, so without a pool each one opened a PostgreSQL connection
    (about 3 ms of the web process's CPU per request, py-spy under ``scripts/bench_upload``). ``config.asgi`` and
    ``config.internal_asgi`` turn it on; Celery's prefork children and commands keep a connection per task.
    Fail fast while PostgreSQL is down, as without a pool: a request waits at most ``timeout`` s for a connection
    (then 503 ``database_unavailable``), a failed connect is retried once (``reconnect_timeout``) instead of
    psycopg's backoff of minutes, and each connection is checked as it is handed out (``CONN_HEALTH_CHECKS``), so
    those a restart killed are dropped, not used.
    """
    if not env.bool("QUIVER_DB_POOL", default=False) or not database["ENGINE"].endswith("postgresql"):
        return database
    if importlib.util.find_spec("psycopg_pool") is None:  # a venv not yet refreshed from requirements.txt
        return database
    pool = {"min_size": 1, "max_size": env.int("QUIVER_DB_POOL_MAX", default=16), "timeout": 3.0,
            "reconnect_timeout": 1.0, "max_idle": 300.0}
    return {**database, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {**database.get("OPTIONS", {}), "pool": pool}}


DATABASES["default"] = pooled(DATABASES["default"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_TZ = True
STATIC_URL = "/static/"
# Only for `collectstatic` in deployments that want it; embedded mode serves straight from the finders.
STATIC_ROOT = env("DJANGO_STATIC_ROOT", default=None)
# The console's Vite build (base "/static/"); whitenoise serves it straight from the finders, so no collectstatic
# step is needed in embedded mode (production may still collect into STATIC_ROOT).
QUIVER_CONSOLE_DIR = Path(env("QUIVER_CONSOLE_DIR", default=str(BASE_DIR / "frontend" / "dist")))
STATICFILES_DIRS = [QUIVER_CONSOLE_DIR] if QUIVER_CONSOLE_DIR.is_dir() else []
WHITENOISE_USE_FINDERS = True

# Uploads above this stay on disk, never whole in memory (Django's TemporaryFileUploadHandler).
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
# Body caps, enforced while reading by config.front_door (before Django spools anything): JSON bodies (prompts,
# API calls) and bodies of requests that carry no credentials at all (login forms).
QUIVER_MAX_JSON_BYTES = env.int("QUIVER_MAX_JSON_BYTES", default=4 * 1024 * 1024)
QUIVER_MAX_ANONYMOUS_BODY_BYTES = env.int("QUIVER_MAX_ANONYMOUS_BODY_BYTES", default=64 * 1024)
# Django's own check on non-file bodies, for servers without the front door (WSGI); 400 via handler400.
DATA_UPLOAD_MAX_MEMORY_SIZE = QUIVER_MAX_JSON_BYTES

REST_FRAMEWORK = {
    # Keys first: a request carrying a bearer key is judged by its key even with a console session cookie.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.HasScope"],
    "DEFAULT_PARSER_CLASSES": [
        "common.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "common.parsers.FormParser",
    ],
    "EXCEPTION_HANDLER": "common.exceptions.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {"TITLE": "Quiver control-plane API", "VERSION": "0.1.0"}

# Console logins (operators included): Django's validators, checked by quiver_user_create (NIST SP 800-63B §5.1.1.2:
# at least 8 characters, checked against common passwords; we ask 12).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- Celery (conventions §8): named queues, bounded time below Redis's visibility timeout.
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Serverless broker for the demo (kombu's filesystem transport, docs/architecture.md "Local").
    _queue_dir = env("CELERY_FILESYSTEM_DIR", default=str(BASE_DIR / "var" / "celery"))
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": _queue_dir, "data_folder_out": _queue_dir, "processed_folder": _queue_dir + "-done",
        "store_processed": False, "polling_interval": 0.2, "control_folder": _queue_dir + "-control",
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 600
CELERY_TASK_SOFT_TIME_LIMIT = 540
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ROUTES = schedule.TASK_ROUTES
CELERY_BEAT_SCHEDULE = schedule.beat_schedule(validation_sweep_s=env.float("QUIVER_SWEEP_INTERVAL_S", default=60.0))
# A child killed mid-task (OOM, SIGKILL) puts its acks_late task back on the queue instead of acking it.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
QUIVER_SWEEP_UPLOADED_AFTER_S = env.int("QUIVER_SWEEP_UPLOADED_AFTER_S", default=120)
QUIVER_VALIDATION_MAX_ATTEMPTS = env.int("QUIVER_VALIDATION_MAX_ATTEMPTS", default=3)
QUIVER_GC_GRACE_S = env.int("QUIVER_GC_GRACE_S", default=3600)

# --- S3 (conventions §7: AWS_S3_ENDPOINT_URL points boto3 at the local S3 server).
AWS_S3_ENDPOINT_URL = env("AWS_S3_ENDPOINT_URL", default=None)
AWS_ACCESS_KEY_ID = env("AWS_ACCESS_KEY_ID", default=None)
AWS_SECRET_ACCESS_KEY = env("AWS_SECRET_ACCESS_KEY", default=None)
AWS_STORAGE_BUCKET_NAME = env("AWS_STORAGE_BUCKET_NAME", default="quiver")
AWS_S3_REGION_NAME = env("AWS_S3_REGION_NAME", default="us-east-1")
# The S3 endpoint as browsers reach it (presigned part URLs are signed for this host); default AWS_S3_ENDPOINT_URL.
AWS_S3_BROWSER_ENDPOINT_URL = env("AWS_S3_BROWSER_ENDPOINT_URL", default=None)
# Browser-direct uploads (adapters_app.direct_upload): part size, part-URL lifetime, and how long an unfinished
# upload may stay open before the sweeper aborts it.
QUIVER_UPLOAD_PART_BYTES = env.int("QUIVER_UPLOAD_PART_BYTES", default=16 * 1024 * 1024)  # half the presigns of 8 MiB
QUIVER_UPLOAD_URL_EXPIRY_S = env.int("QUIVER_UPLOAD_URL_EXPIRY_S", default=600)
QUIVER_UPLOAD_TTL_S = env.int("QUIVER_UPLOAD_TTL_S", default=6 * 3600)
# Nodes hold no S3 credential: each load carries one presigned GET per file, valid this long (the agent starts every
# download at once; a transfer begun before expiry finishes). Signed for AWS_S3_NODE_ENDPOINT_URL (the S3 endpoint as
# nodes reach it), default AWS_S3_ENDPOINT_URL.
QUIVER_NODE_FETCH_URL_TTL_S = env.int("QUIVER_NODE_FETCH_URL_TTL_S", default=300)
AWS_S3_NODE_ENDPOINT_URL = env("AWS_S3_NODE_ENDPOINT_URL", default=None)

# --- Quiver
QUIVER_API_KEY_PREFIX = "qv"
# QUIVER_API_KEY_HMAC_KEY (the digest key of tenant API keys) is a secret of its own, read per environment:
# rotating DJANGO_SECRET_KEY (sessions, CSRF) must not revoke every API key.
QUIVER_API_KEY_LAST_USED_INTERVAL_S = 60
# Console logins: failures counted per username and address, per address, and per username (that ceiling refusing
# only addresses that failed for it) over a sliding window (tenants.login_throttle).
QUIVER_LOGIN_MAX_FAILURES = env.int("QUIVER_LOGIN_MAX_FAILURES", default=5)
QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT = env.int("QUIVER_LOGIN_MAX_FAILURES_PER_ACCOUNT", default=100)
QUIVER_LOGIN_MAX_FAILURES_PER_IP = env.int("QUIVER_LOGIN_MAX_FAILURES_PER_IP", default=50)
QUIVER_LOGIN_LOCKOUT_S = env.int("QUIVER_LOGIN_LOCKOUT_S", default=900)
# The admin lives on the internal listener (config.internal_urls); this also mounts it on the public one.
QUIVER_PUBLIC_ADMIN = env.bool("QUIVER_PUBLIC_ADMIN", default=False)
QUIVER_MAX_UPLOAD_BYTES = env.int("QUIVER_MAX_UPLOAD_BYTES", default=512 * 1024 * 1024)
QUIVER_MAX_ARCHIVE_MEMBERS = env.int("QUIVER_MAX_ARCHIVE_MEMBERS", default=64)
# QUIVER_NODE_SECRET, read per environment: every node's key and heartbeat token are derived from it
# (inference.fleet.node_keys); nodes hold only their own.
QUIVER_NODE_STALE_AFTER_S = env.int("QUIVER_NODE_STALE_AFTER_S", default=30)
# A node's heartbeats closer together than this are refused (429) before any validation or write: a stolen heartbeat
# token flooding the listener slowed every node's accepts (attack round). Agents send one every
# QUIVER_HEARTBEAT_SECONDS (5 s by default); 0 turns the floor off.
QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S = env.float("QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S", default=0.5)
# Capacity ceilings (inference.policy.node_capacity): the max_loras / max_cpu_loras a node's heartbeat reports are
# used up to these, unless quiver_node_register set the node's own (--max-loras, --max-cpu-loras); a stolen node
# credential reporting 100,000 CPU slots was sent warms for every tenant's adapters (attack round). Defaults: the
# engine figures this repository ships (docker-compose.yml and platform/k8s/base: --max-loras 8, --max-cpu-loras 32),
# above vLLM's own defaults (max_loras 1, max_cpu_loras = max_loras; vLLM sets no upper limit). The rank's ceiling is
# the base model's max_lora_rank (--max-lora-rank per node).
QUIVER_NODE_MAX_LORAS_CEILING = env.int("QUIVER_NODE_MAX_LORAS_CEILING", default=8)
QUIVER_NODE_MAX_CPU_LORAS_CEILING = env.int("QUIVER_NODE_MAX_CPU_LORAS_CEILING", default=32)
if not 1 <= QUIVER_NODE_MAX_LORAS_CEILING <= QUIVER_NODE_MAX_CPU_LORAS_CEILING <= 2**31 - 1:
    raise ImproperlyConfigured(
        f"QUIVER_NODE_MAX_LORAS_CEILING={QUIVER_NODE_MAX_LORAS_CEILING}, QUIVER_NODE_MAX_CPU_LORAS_CEILING="
        f"{QUIVER_NODE_MAX_CPU_LORAS_CEILING}: use 1 <= max_loras ceiling <= max_cpu_loras ceiling (vLLM's rule).")
# Node gauges kept over time for the console's fleet charts (inference.fleet.node_samples): one row per node per
# interval, deleted after the retention.
QUIVER_NODE_SAMPLE_INTERVAL_S = env.float("QUIVER_NODE_SAMPLE_INTERVAL_S", default=10.0)
QUIVER_NODE_SAMPLE_RETENTION_S = env.int("QUIVER_NODE_SAMPLE_RETENTION_S", default=86400)
# Node choice per request: "affinity" (Quiver's residency-first inference.policy.routing.route) or "round_robin"
# (route_round_robin, the baseline scripts/bench_fleet measures it against).
QUIVER_ROUTING_POLICY = env.str("QUIVER_ROUTING_POLICY", default="affinity")
if QUIVER_ROUTING_POLICY not in ("affinity", "round_robin"):
    raise ImproperlyConfigured(f"QUIVER_ROUTING_POLICY={QUIVER_ROUTING_POLICY!r}: use affinity or round_robin.")
# Routing's bounded-load factor (inference.policy.routing.RouteConfig.load_bound): a request leaves its adapter's home
# for another holder once the home carries more than this x the candidates' mean load (+1). Raise it where a reload
# costs more than queueing behind the home's requests (CPU nodes, small batches: scripts/bench_fleet).
QUIVER_ROUTING_LOAD_BOUND = env.float("QUIVER_ROUTING_LOAD_BOUND", default=1.35)
if not 1.0 <= QUIVER_ROUTING_LOAD_BOUND <= 1000.0:
    raise ImproperlyConfigured(f"QUIVER_ROUTING_LOAD_BOUND={QUIVER_ROUTING_LOAD_BOUND!r}: use a number from 1 (spill "
                               "at the mean load) to 1000 (never spill off the home for load).")
# Placement's miss cost (inference.policy.placement.PlacementConfig.miss_cost): the extra work, in requests, of a
# request that needs an engine load. 0 suits GPUs serving long generations (a load is small beside one); on the CPU
# dev node, where a 16-token request takes tens of ms and a control-plane warm a few hundred, ~3 (scripts/bench_fleet).
QUIVER_PLACEMENT_MISS_COST = env.float("QUIVER_PLACEMENT_MISS_COST", default=0.0)
if not 0.0 <= QUIVER_PLACEMENT_MISS_COST <= 1000.0:
    raise ImproperlyConfigured(f"QUIVER_PLACEMENT_MISS_COST={QUIVER_PLACEMENT_MISS_COST!r}: use a number from 0 "
                               "to 1000 (requests' worth of work per engine load).")
# Placement's replica worth (inference.policy.placement.PlacementConfig.replica_worth): where more versions have traffic
# than the fleet has CPU slots, a rate-driven extra replica must carry at least this many times the slot frontier's
# rate. 8 fits the simulator's 500 versions over 256 slots; lower replicates a dominant head adapter on small fleets.
QUIVER_PLACEMENT_REPLICA_WORTH = env.float("QUIVER_PLACEMENT_REPLICA_WORTH", default=8.0)
if not 0.0 <= QUIVER_PLACEMENT_REPLICA_WORTH <= 1000.0:
    raise ImproperlyConfigured(f"QUIVER_PLACEMENT_REPLICA_WORTH={QUIVER_PLACEMENT_REPLICA_WORTH!r}: use a number from "
                               "0 (replicate by rate alone) to 1000 (almost never replicate past the slots).")
# How long a gateway request waits for a cold adapter to be warmed before answering 503.
QUIVER_WARM_WAIT_S = env.float("QUIVER_WARM_WAIT_S", default=60.0)
# A promotion or canary waits at most this long (seconds) for its versions to be resident on a live node before it
# switches traffic (adapters_app.serving; docs/versions.md).
QUIVER_PROMOTE_WARM_WAIT_S = env.float("QUIVER_PROMOTE_WARM_WAIT_S", default=30.0)
QUIVER_PROXY_TIMEOUT_S = env.float("QUIVER_PROXY_TIMEOUT_S", default=300.0)

# --- Gateway fast path (issue 7). Redis carries cache invalidation, rate limits and the usage stream; without it
# (the SQLite demo) caches live QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S and usage is written straight to the database.
QUIVER_GATEWAY_REDIS_URL = env("QUIVER_GATEWAY_REDIS_URL",
                               default=REDIS_URL if CELERY_BROKER_URL.startswith("redis") else "")
QUIVER_GATEWAY_BUS_CHANNEL = "quiver:gateway:invalidate"
QUIVER_GATEWAY_CACHE_TTL_S = env.float("QUIVER_GATEWAY_CACHE_TTL_S", default=60.0)
QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S = env.float("QUIVER_GATEWAY_CACHE_TTL_NO_BUS_S", default=1.0)
QUIVER_GATEWAY_FLEET_REFRESH_S = env.float("QUIVER_GATEWAY_FLEET_REFRESH_S", default=0.5)
# Keep-alive connections per gateway process to all engines together (the aiohttp pool of inference.gateway.upstream).
QUIVER_GATEWAY_UPSTREAM_POOL = env.int("QUIVER_GATEWAY_UPSTREAM_POOL", default=512)
# Platform-wide caps on a request's choices (n, best_of) and logprobs (OpenAI's own logprobs cap is 5).
QUIVER_GATEWAY_MAX_N = env.int("QUIVER_GATEWAY_MAX_N", default=8)
QUIVER_GATEWAY_MAX_LOGPROBS = env.int("QUIVER_GATEWAY_MAX_LOGPROBS", default=5)
# Under a TPM limit a prompt counts as the engine's /tokenize counts it, up to this many characters; a longer one
# counts its UTF-8 bytes (never below its tokens) without engine work (inference.gateway.limits.prompt_token_counts).
QUIVER_GATEWAY_TOKENIZE_MAX_CHARS = env.int("QUIVER_GATEWAY_TOKENIZE_MAX_CHARS", default=100_000)
# Admission from KV pressure (inference.policy.admission, inference.gateway.admission): a node is saturated at
# QUEUE waiting requests or KV use >= KV (GIE's defaults); figures older than MAX_AGE_S are unknown (= admit).
# When every eligible node is saturated a request waits in the gateway, in VTC order across tenants, for at most
# MAX_WAIT_S, with at most MAX_QUEUE waiting per gateway process; past either it gets 429 + Retry-After.
QUIVER_ADMISSION_QUEUE_SATURATED = env.int("QUIVER_ADMISSION_QUEUE_SATURATED", default=5)
QUIVER_ADMISSION_KV_SATURATED = env.float("QUIVER_ADMISSION_KV_SATURATED", default=0.8)
QUIVER_ADMISSION_MAX_AGE_S = env.float("QUIVER_ADMISSION_MAX_AGE_S", default=0.25)
QUIVER_ADMISSION_MAX_WAIT_S = env.float("QUIVER_ADMISSION_MAX_WAIT_S", default=15.0)
QUIVER_ADMISSION_MAX_QUEUE = env.int("QUIVER_ADMISSION_MAX_QUEUE", default=1000)
# Running slots per node across all gateway processes (0 = no budget), and the slots no single tenant may take:
# a newcomer then finds a slot at once instead of queueing behind a flooder (inference.policy.admission.slot_free).
# Size SLOTS below the engines' max_num_seqs (the CPU dev engine runs 32).
QUIVER_ADMISSION_NODE_SLOTS = env.int("QUIVER_ADMISSION_NODE_SLOTS", default=0)
QUIVER_ADMISSION_SLOT_RESERVE = env.int("QUIVER_ADMISSION_SLOT_RESERVE", default=2)
# With a slot budget (NODE_SLOTS > 0), while other tenants are active on a node its heaviest tenant starts at most
# one request there per START_SPACING_S (about one prefill step; per gateway process): starts taken together come
# back as waves of simultaneous prefills (inference.policy.admission.start_spaced). It caps that tenant at
# 1 / START_SPACING_S starts a second per node: lower it for nodes that start more. 0 = off.
QUIVER_ADMISSION_START_SPACING_S = env.float("QUIVER_ADMISSION_START_SPACING_S", default=0.05)
# While other tenants are active on a node, the tenant holding most of its running requests streams in chunks of
# this many tokens (vLLM's per-request stream_interval; the first token still goes out at once): fewer chunks for the
# node's host to build, relay and meter (inference.policy.admission.stream_interval). 1 = a chunk per token always.
QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL = env.int("QUIVER_ADMISSION_HEAVY_STREAM_INTERVAL", default=8)
# How often each gateway process re-reads node load and the shared VTC counters from Redis.
QUIVER_ADMISSION_REFRESH_S = env.float("QUIVER_ADMISSION_REFRESH_S", default=0.05)
# Requests-per-minute limits are also paced (GCRA, inference.policy.admission.rpm_pace): bursts of BURST_S seconds
# worth of the limit, at least BURST_MIN requests (never more than the limit); BURST_S 60 = the plain minute window.
QUIVER_LIMIT_BURST_S = env.float("QUIVER_LIMIT_BURST_S", default=1.0)
QUIVER_LIMIT_BURST_MIN = env.int("QUIVER_LIMIT_BURST_MIN", default=20)
QUIVER_USAGE_STREAM = "quiver:usage"
QUIVER_USAGE_GROUP = "usage-writers"
# Raw usage records older than this many days are deleted (usage-retention beat task); 0 keeps them forever.
# The per-minute rollups (inference.metering.rollups) are kept.
QUIVER_USAGE_RETENTION_DAYS = env.int("QUIVER_USAGE_RETENTION_DAYS", default=90)
# Minutes this recent are recomputed on every rollup run: a record is written when its request ends (a stream up to
# QUIVER_PROXY_TIMEOUT_S after it arrived, after a warm wait), but counts in the minute it arrived.
QUIVER_USAGE_ROLLUP_LOOKBACK_S = env.int("QUIVER_USAGE_ROLLUP_LOOKBACK_S", default=600)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"kv": {"()": "inference.logfmt.KeyValueFormatter"}},  # events' extra fields on the line
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "kv"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
    # The gateway's per-request routing line (inference.gateway.exchange.route_log): INFO turns it on, for
    # scripts/bench_fleet's recorded runs; off by default (one line per request).
    "loggers": {"inference.gateway.route": {"level": env("QUIVER_GATEWAY_ROUTE_LOG", default="WARNING")}},
}
