#!/usr/bin/env python
"""Django's command-line utility for Quiver.

Without ``DJANGO_SETTINGS_MODULE`` the production settings apply (missing or placeholder secrets stop the start);
the demo and the tests choose theirs explicitly.
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
