"""Fixtures for the node tests: the shared S3 server (the engine fixtures come from the root conftest)."""

from __future__ import annotations

from tests.fixtures.s3 import s3_server  # noqa: F401  (re-exported fixture)
