#!/usr/bin/env python
"""Django's command-line utility for Quiver.

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly.
"""

import os
import sys


def main() -> None:
    """Run a management command; settings that cannot load (a missing or placeholder secret, no ``DATABASE_URL``)
    end it with one line on stderr naming the variables and the fix, exit status 1, instead of Django's traceback."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:  # around the whole run, not a settings read first: Django applies --settings / --pythonpath itself
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        sys.exit(f"manage.py: {' '.join(str(exc).split())}")


if __name__ == "__main__":
    main()
