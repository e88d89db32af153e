"""Developer tooling: start the backing services (PostgreSQL, Redis, S3) without Docker.

Nothing here is imported by the running application; it serves the test command, CI, the scripts and the demo.
See ``devtools/services.py`` and docs/services.md. It also holds test and benchmark helpers that the product never
imports: synthetic adapters (``synthetic_adapters``), the safetensors fuzzer (``safetensors_fuzz``) and the
fleet simulator (``simulate``).
"""
