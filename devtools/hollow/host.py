"""Many emulated nodes in one process: for each, an emulated engine and a real node agent, each on its own port.

Usage: ``python -m devtools.hollow.host <spec.json>``, where the spec is::

    {"calibration": "h100-8b", "base_model": "...", "tick_ms": 20, "stats_path": "...json",
     "env": {...the agents' shared environment: AWS_*, QUIVER_CONTROL_URL, REDIS_URL, QUIVER_HEARTBEAT_SECONDS...},
     "nodes": [{"name", "engine_port", "agent_port", "node_key", "node_token", "cache_dir",
                "max_loras", "max_cpu_loras", "control_url" (optional: this node's listener, over the shared
                QUIVER_CONTROL_URL)}, ...]}

The agents are ``inference.node.agent.create_app`` with ``NodeSettings.from_env`` of the shared environment plus the
node's own variables, exactly as ``uvicorn inference.node.agent:app`` builds one; they share one boto3 client (it is
thread-safe). Each heartbeat's round trip as the agent sees it is timed (``send_heartbeat`` wrapped) and written,
with every engine's counters, to ``stats_path`` every 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn

from devtools.hollow.app import create_app as engine_app
from devtools.hollow.costs import calibration
from devtools.hollow.engine import HollowEngine
from inference.node import heartbeat
from inference.node.agent import create_app as agent_app
from inference.node.config import NodeSettings

HEARTBEAT_MS: list[float] = []


def _timed_heartbeat() -> None:
    original = heartbeat.send_heartbeat

    async def timed(*args: Any, **kwargs: Any) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            HEARTBEAT_MS.append((time.perf_counter() - started) * 1000)

    heartbeat.send_heartbeat = timed  # type: ignore[assignment]


def node_env(shared: dict[str, str], node: dict[str, Any], base_model: str) -> dict[str, str]:
    """The agent environment of one node (what ``demo/run.py`` gives ``uvicorn inference.node.agent:app``)."""
    return {**shared, "QUIVER_NODE_NAME": node["name"], "QUIVER_NODE_KEY": node["node_key"],
            "QUIVER_NODE_TOKEN": node["node_token"], "QUIVER_ENGINE_URL": f"http://127.0.0.1:{node['engine_port']}",
            "QUIVER_BASE_MODEL": base_model, "QUIVER_NODE_CACHE_DIR": node["cache_dir"],
            "QUIVER_AGENT_URL": f"http://127.0.0.1:{node['agent_port']}",
            "QUIVER_MAX_LORAS": str(node["max_loras"]), "QUIVER_MAX_CPU_LORAS": str(node["max_cpu_loras"]),
            "QUIVER_MAX_LORA_RANK": str(node.get("max_lora_rank", 16)),
            **({"QUIVER_CONTROL_URL": node["control_url"]} if node.get("control_url") else {})}


def _server(app: Any, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", access_log=False, timeout_keep_alive=30))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # one handler for all, below
    return server


def engine_stats(engines: dict[str, HollowEngine]) -> dict[str, Any]:
    """Per-engine counters for the scale run's figures."""
    return {name: {"loads_total": sum(e.loads.values()), "load_sources": dict(e.load_sources),
                   "arrival_tiers": dict(e.arrival_tiers), "probes": e.probes,
                   "requests": int(sum(e.arrival_tiers.values())), "success": e.request_success,
                   "generation_tokens": e.generation_tokens, "busy_s": round(e.busy_ms / 1000, 3),
                   "preemptions": e.preemptions, "gpu": len(e.loras.gpu), "cpu": len(e.loras.cpu),
                   "events": e.events[-50000:]}
            for name, e in engines.items()}


async def run(spec: dict[str, Any]) -> None:
    """Serve every node of ``spec`` until SIGTERM / SIGINT."""
    _timed_heartbeat()
    costs = calibration(spec.get("calibration", "h100-8b"))
    base_model = spec["base_model"]
    shared = {k: str(v) for k, v in spec["env"].items()}
    servers: list[uvicorn.Server] = []
    engines: dict[str, HollowEngine] = {}
    for node in spec["nodes"]:
        engine = HollowEngine(base_model, costs, max_loras=node["max_loras"], max_cpu_loras=node["max_cpu_loras"],
                              max_lora_rank=node.get("max_lora_rank", 16), tick_ms=float(spec.get("tick_ms", 20)),
                              charge_all_linear=bool(spec.get("charge_all_linear", False)))
        engines[node["name"]] = engine
        servers.append(_server(engine_app(engine, node["node_key"]), node["engine_port"]))
        settings = NodeSettings.from_env(node_env(shared, node, base_model))
        Path(settings.cache_dir).mkdir(parents=True, exist_ok=True)
        servers.append(_server(agent_app(settings), node["agent_port"]))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    stats_path = Path(spec["stats_path"])

    def dump() -> None:
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"at": time.time(), "heartbeat_ms": HEARTBEAT_MS[-20000:],
                                   "engines": engine_stats(engines)}))
        tmp.replace(stats_path)

    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)
        dump()
        if any(t.done() and t.exception() for t in tasks):
            break
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    dump()


def main(argv: list[str] | None = None) -> int:
    """Run the host from a spec file; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("QUIVER_LOG_LEVEL", "WARNING"))
    spec = json.loads(Path(args[0]).read_text())
    asyncio.run(run(spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
