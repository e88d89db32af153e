"""Test settings: real PostgreSQL/Redis/S3 given by env (the test command starts them when absent)."""

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
QUIVER_WARM_WAIT_S = 90.0
