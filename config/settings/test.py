"""Test settings: real PostgreSQL/Redis/S3 given by env (the test command starts them when absent).

Secrets come from env or are random per test process (nothing guessable; every test creates its own keys).
"""

from secrets import token_urlsafe

from config.settings.base import *  # noqa: F403
from config.settings.base import read_secret

SECRET_KEY = read_secret("DJANGO_SECRET_KEY", dev_default=token_urlsafe(48))
QUIVER_API_KEY_HMAC_KEY = read_secret("QUIVER_API_KEY_HMAC_KEY", dev_default=token_urlsafe(32))
QUIVER_NODE_SECRET = read_secret("QUIVER_NODE_SECRET", dev_default=token_urlsafe(32))
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
QUIVER_WARM_WAIT_S = 90.0
# Tests send heartbeats back to back; the floor has its own test (tests/inference/fleet/test_heartbeat_hostile.py).
QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S = 0.0
