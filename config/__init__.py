"""Quiver's Django project package.

Importing the Celery app here makes ``.delay()`` from any Django process use the configured broker
(without it Celery falls back to amqp). Workers start with ``celery -A config worker``.
"""

from workers.celery_app import app as celery_app

__all__ = ("celery_app",)
