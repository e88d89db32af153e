"""The scale-out proof (issue 10): two gateway processes, two CPU vLLM nodes with agents, two Celery workers, on the
suite's PostgreSQL, Redis and S3 server; load through both gateways; one gateway and one node are SIGKILLed mid-run.

Node 1 is the session's engine (no extra engine start), node 2 an engine of this test's own, the one that dies. Every
other part is its own process, as pods would be: the internal listener (heartbeats), two gateways, two workers, two
agents. The load driver, the kill schedule and the verdict are ``scripts/scaleout.py``'s (the stand-alone run of the
same proof, in a fresh database), imported, not copied. The summary is written to the terminal whatever the capture
mode, so CI's log shows requests per gateway and node, the errors at the kills and the converged residency.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from demo.api_client import upload_adapter, wait_validated
from devtools.proc import free_port
from inference.fleet.node_keys import node_credentials
from inference.fleet.nodes import node_register
from inference.node.launch import EngineConfig
from tenants.services import api_key_create, limits_set
from tests.factories import TenantFactory
from tests.fixtures.stack import (
    ChildProcess,
    django_process_env,
    gateway_process_pair,
    start_agent,
    start_child,
    start_uvicorn,
)
from tests.fixtures.vllm import TEST_NODE_NAME, TINY_SERVED_NAME, RunningEngine, engine_running
from workers import schedule
from workers.celery_app import app as celery_app

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]
NODE_2 = "scaleout-node-2"
STALE_S = 20  # heartbeats every 1 s; under 2 busy cores some arrive seconds late, so not the 30 s default either
RPM = 12


def _scaleout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quiver_scaleout", REPO / "scripts" / "scaleout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _start_workers(stack: ExitStack, log_dir: Path) -> list[ChildProcess]:
    workers = []
    for i in (1, 2):
        name = f"scaleout-worker-{i}"
        child = start_child(name, [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                   "--concurrency=2", "-Q", ",".join(schedule.ALL_QUEUES), "-n", f"{name}@%h",
                                   "--loglevel=WARNING"], django_process_env(name), log_dir)
        stack.callback(child.stop)
        workers.append(child)
    deadline = time.monotonic() + 120
    while True:
        answered = {name for reply in celery_app.control.ping(timeout=1.0) for name in reply}
        if all(any(n.startswith(w.name + "@") for n in answered) for w in workers):
            return workers
        assert time.monotonic() < deadline, "workers never answered a ping:\n" + workers[0].tail()
        time.sleep(1)


def _wait_live(scaleout: ModuleType, names: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not names <= {n for n, state in scaleout.residency().items() if state["live"]}:
        assert time.monotonic() < deadline, f"nodes {sorted(names)} never all reported live: {scaleout.residency()}"
        time.sleep(0.5)


def _write_terminal(request: pytest.FixtureRequest, lines: list[str]) -> None:
    """Print past pytest's capture, so the summary is in the CI log with or without ``-s``."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_sep("=", "scale-out proof")
        for line in lines:
            reporter.write_line(line)


def test_two_gateways_two_nodes_share_limits_and_survive_a_kill_of_each(  # type: ignore[no-untyped-def]
        request: pytest.FixtureRequest, settings, base_model, clean_vllm_engine: RunningEngine,
        tiny_base_dir: Path, tiny_adapters: dict[str, Path], tmp_path: Path) -> None:
    scaleout = _scaleout()
    settings.QUIVER_NODE_STALE_AFTER_S = STALE_S  # this process's residency view ages nodes out as the others do
    stale = {"QUIVER_NODE_STALE_AFTER_S": str(STALE_S)}
    with ExitStack() as stack:
        node_2_engine = stack.enter_context(engine_running(
            EngineConfig.cpu_dev(tiny_base_dir, TINY_SERVED_NAME, port=free_port(),
                                 api_key=node_credentials(NODE_2).key), tmp_path / "engine-2.log"))
        internal_url, internal = start_uvicorn("web-internal", "config.internal_asgi:application",
                                               django_process_env("scaleout-internal", **stale), tmp_path)
        stack.callback(internal.stop)
        gateway_procs = stack.enter_context(gateway_process_pair(tmp_path, **stale))
        gateways = {f"gateway-{i}": gw.url for i, gw in enumerate(gateway_procs, start=1)}
        _start_workers(stack, tmp_path)
        engines = {TEST_NODE_NAME: clean_vllm_engine, NODE_2: node_2_engine}
        agents: dict[str, ChildProcess] = {}
        for name, engine in engines.items():
            url, agents[name] = start_agent(node_name=name, engine=engine, control_url=internal_url,
                                            cache=tmp_path / f"cache-{name}", log_dir=tmp_path)
            stack.callback(agents[name].stop)
            node_register(name=name, agent_url=url, engine_url=engine.url, base_model_name=base_model.base_model_name)
        _wait_live(scaleout, set(engines), 60)

        tenant = TenantFactory()
        _, secret = api_key_create(tenant, name="load")
        api = stack.enter_context(httpx.Client(base_url=gateways["gateway-1"], timeout=120,
                                               headers={"Authorization": f"Bearer {secret}"}))
        adapters = sorted(tiny_adapters)
        for name in adapters:
            number = upload_adapter(api, name, tiny_adapters[name], base_model=TINY_SERVED_NAME)["number"]
            version = wait_validated(api, name, number, timeout=180)
            assert version["status"] == "ready", version
        models = [TINY_SERVED_NAME, *adapters]
        for url in gateways.values():  # every adapter warm, each gateway's caches filled
            for model in models:
                answer = api.post(url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
                assert answer.status_code == 200, answer.text

        limited, limited_secret = api_key_create(tenant, name="rate-limited", scopes=["inference"])
        limits_set(limited, limits={"rpm_limit": RPM})  # before any gateway has seen the key: none caches it unlimited
        limits = scaleout.rate_limit_check(gateways, TINY_SERVED_NAME, secret=limited_secret, rpm=RPM)

        def kill_node_2() -> None:
            os.killpg(node_2_engine.pid, signal.SIGKILL)  # the API server, EngineCore and Worker (its own session)
            agents[NODE_2].kill()

        outcomes, windows, served_by_node = scaleout.load_with_kills(
            gateways, {name: e.url for name, e in engines.items()}, secret, models,
            kill_gateway=("gateway-2", gateway_procs[1].child.kill), kill_node=(NODE_2, kill_node_2),
            concurrency=4, timeout=360)
        view = scaleout.await_convergence(adapters, NODE_2, 90)

    summary: dict[str, Any] = scaleout.summarize(
        limits=limits, outcomes=outcomes, kills=windows, served_by_node=served_by_node, view=view, adapters=adapters,
        killed_gateway="gateway-2", killed_node=NODE_2, gateways=sorted(gateways))
    _write_terminal(request, scaleout.report(summary))
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    if not summary["ok"]:  # keep every process's log where the next run (or CI's artifacts) can read it
        shutil.copytree(tmp_path, REPO / ".cache" / "scaleout-test-failed", dirs_exist_ok=True)
    detail = json.dumps({k: v for k, v in summary.items() if k != "errors_at_kill"}, indent=1)[:4000]

    assert summary["rate_limit_ok"], limits
    assert summary["kills_missing"] == [], detail
    assert summary["errors_unexplained"] == [], detail
    # A clean error: the connection to the killed gateway drops (no answer), or a gateway answers OpenAI's error shape.
    assert all(e["status"] == 0 or (e["status"] in (502, 503) and '"error"' in e["error"])
               for e in summary["errors_at_kill"]), summary["errors_at_kill"]
    assert all(summary["served_by_gateway"].get(g, 0) > 0 for g in gateways), detail
    assert all(n > 0 for n in served_by_node.values()), detail
    assert summary["served_after_kills"] == summary["requests_after_kills"] > 0, detail
    assert summary["converged"] and not view[NODE_2]["live"], detail
    assert summary["ok"], detail
