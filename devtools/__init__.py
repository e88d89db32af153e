"""Developer tooling: start the backing services (PostgreSQL, Redis, S3) without Docker.

Nothing here is imported by the running application; it serves the test command, CI and the demo.
See ``devtools/services.py`` and ``/work/shared/notes/services.md``.
"""
