"""Fault injection on real services: PostgreSQL restarts under a running gateway and worker; both recover without
a restart of their own.

The gateway (uvicorn, ``config.asgi``) and a Celery worker (with beat) are real subprocesses on a private PostgreSQL
cluster (a copy of this session's test database) and a private Redis. The test restarts that cluster for real (fast
shutdown: every session is terminated; connections refused for 3 s; started again on the same port and data). Nothing lost: every
upload answered 201 — including one whose validation runs across the restart — ends ``ready``; nothing stuck: no
version stays ``uploaded``/``validating``. During the outage every route answers 503 ``database_unavailable`` with
``Retry-After``, never a 500. Afterwards, with no restart: an upload is accepted (the first one used to answer 500
on a dead connection kept by the front door) and validated; a key minted through the API after the restart (read
from the database, not a cache) works on the control plane and on the OpenAI gateway (``/v1/models``,
``/v1/completions``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from adapters_app.models import Adapter, AdapterVersion
from devtools.postgres import PostgresService
from devtools.redis_server import start_redis
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.faults import Proc, gateway_process, private_postgres_copy, stack_env, worker_process

pytestmark = pytest.mark.django_db(transaction=True)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DOWN_S = 3.0


@pytest.fixture
def stack(base_model: Any, tmp_path: Path) -> Iterator[tuple[PostgresService, Proc, Proc, str]]:
    """``(private PostgreSQL, gateway, worker, API key)``: the tenant and key are made here, then the test
    database is copied into the private cluster; the worker runs beat with the sweeper every 2 s."""
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="ci")
    redis = start_redis(tmp_path / "redis")
    try:
        with private_postgres_copy() as pg:
            def env(name: str, **extra: str) -> dict[str, str]:
                return stack_env(application_name=name, database_url=f"{pg.url}?application_name={name}",
                                 redis_url=redis.url, extra=extra)

            with gateway_process(env("faults-pg-gw"), tmp_path / "gw.log") as gw, \
                    worker_process(env("faults-pg-worker", QUIVER_SWEEP_INTERVAL_S="2",
                                       QUIVER_SWEEP_UPLOADED_AFTER_S="3"),
                                   tmp_path / "worker.log", beat=True) as worker:
                yield pg, gw, worker, key
    finally:
        redis.stop()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _upload(gw: Proc, key: str, name: str, folder: Path) -> httpx.Response:
    files = [("files", (n, (folder / n).read_bytes())) for n in ADAPTER_FILES]
    return httpx.post(f"{gw.url}/api/v1/adapters/{name}/versions", headers=_auth(key),
                      data={"base_model": "tiny-llama"}, files=files, timeout=60)


def _statuses(pg: PostgresService) -> dict[str, str]:
    """Every version's status in the private database, ``{adapter name: status}`` (one version each here)."""
    with psycopg.connect(pg.url, connect_timeout=5) as conn:
        rows = conn.execute(f"SELECT a.name, v.status FROM {AdapterVersion._meta.db_table} v "  # noqa: S608
                            f"JOIN {Adapter._meta.db_table} a ON a.id = v.adapter_id").fetchall()
    return {name: status for name, status in rows}


def _all_ready(pg: PostgresService, names: set[str], worker: Proc, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = _statuses(pg)
        if set(statuses) == names and set(statuses.values()) == {"ready"}:
            return
        assert time.monotonic() < deadline and "rejected" not in statuses.values(), (statuses, worker.log_tail())
        time.sleep(0.3)


def _unavailable(answer: httpx.Response, *, openai: bool = False) -> bool:
    if answer.status_code != 503:
        return False
    code = answer.json()["error"]["code"] if openai else answer.json()["code"]
    return answer.status_code == 503 and code == "database_unavailable" and answer.headers.get("retry-after") == "5"


def test_gateway_and_worker_survive_a_postgres_restart(stack, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    pg, gw, worker, key = stack
    folder = tiny_adapters["qv-r8"]
    first = _upload(gw, key, "before", folder)
    assert first.status_code == 201, first.text
    _all_ready(pg, {"before"}, worker)
    warm = httpx.get(f"{gw.url}/v1/models", headers=_auth(key), timeout=30)
    assert warm.status_code == 200, warm.text  # every connection in use once, so each has one to lose

    across = _upload(gw, key, "across", folder)  # validated while the server goes away
    assert across.status_code == 201, across.text
    pg.stop()  # fast shutdown: every session of the gateway and worker is terminated
    down_at = time.monotonic()
    during = {
        "list": httpx.get(f"{gw.url}/api/v1/adapters", headers=_auth(key), timeout=30),
        "upload": _upload(gw, key, "during", folder),
        "models": httpx.get(f"{gw.url}/v1/models", headers=_auth(key), timeout=30),
    }
    time.sleep(max(0.0, DOWN_S - (time.monotonic() - down_at)))
    pg.start()  # same port and data
    assert _unavailable(during["list"]), during["list"].text[:500]
    assert _unavailable(during["upload"]), (during["upload"].text[:500], gw.log_tail())
    assert _unavailable(during["models"], openai=True), during["models"].text[:500]

    # Recovered, no restart of either process: the first upload after is stored; all accepted ones end ready.
    after = _upload(gw, key, "after", folder)
    assert after.status_code == 201, (after.text, gw.log_tail())
    _all_ready(pg, {"before", "across", "after"}, worker)

    minted = httpx.post(f"{gw.url}/api/v1/api-keys", headers=_auth(key), json={"name": "after-restart"}, timeout=30)
    assert minted.status_code == 201, minted.text
    fresh = minted.json()["secret"]
    listed = httpx.get(f"{gw.url}/api/v1/adapters", headers=_auth(fresh), timeout=30)
    assert listed.status_code == 200 and {a["name"] for a in listed.json()} == {"before", "across", "after"}
    models = httpx.get(f"{gw.url}/v1/models", headers=_auth(fresh), timeout=30)
    assert models.status_code == 200 and {m["id"] for m in models.json()["data"]} >= {"before", "across", "after"}
    served = httpx.post(f"{gw.url}/v1/completions", headers=_auth(fresh), timeout=30,
                        json={"model": "after", "prompt": "x", "max_tokens": 1})
    assert served.status_code == 503 and served.json()["error"]["code"] == "no_capacity", served.text  # no node
