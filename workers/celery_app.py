"""The Celery application of the worker processes: broker settings come from Django's ``CELERY_*`` names, queues
and the beat schedule from ``workers.schedule`` (through the settings, which pass it the intervals set by env), tasks from each installed app's ``tasks`` module
(``adapters_app.tasks``, ``inference.fleet.tasks``, ``inference.metering.tasks``): every app owns its tasks.

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly.
"""

from __future__ import annotations

import os

from celery import Celery

from workers import kombu_fix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

kombu_fix.install()
app = Celery("quiver")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
