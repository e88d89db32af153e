"""Local development and the README demo: SQLite by default, everything overridable from env."""

from config.settings.base import *  # noqa: F403

DEBUG = env.bool("DJANGO_DEBUG", default=True)  # noqa: F405
