"""Root fixtures. Backing services (PostgreSQL, Redis, S3) come from env, started by ``devtools.services`` when absent."""

pytest_plugins = ["tests.fixtures.vllm", "tests.fixtures.stack"]
