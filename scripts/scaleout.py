"""Scale-out proof on one machine: two gateways, two CPU vLLM nodes with agents, two workers, one kill of each.

Usage:
    .venv/bin/python -m devtools.services run -- .venv/bin/python scripts/scaleout.py [--json out.json]

Runs on the PostgreSQL, Redis and S3 server named by ``DATABASE_URL``, ``REDIS_URL`` and ``AWS_*`` (started by
``devtools.services`` when absent), each in a fresh database / Redis db / bucket of its own, so it can run beside
the test suite. It starts the whole data plane as separate processes, as Kubernetes would run pods:

- ``web``: the control plane's REST API, and ``web-internal``: its internal listener (node heartbeats), as the
  Deployments ``web`` and ``web-internal``;
- ``gateway-1``, ``gateway-2``: ``config.asgi`` on two ports, as two replicas of the Deployment ``gateway``;
- ``worker-1``, ``worker-2``: Celery workers on every queue;
- ``node-1``, ``node-2``: a CPU vLLM engine (tiny Llama) and its agent each, registered first with
  ``manage.py quiver_node_register`` (each gets its own key and heartbeat token).

Load: ``--concurrency`` client threads send completions (the base model and two adapters, in turn) through both
gateways. The client plays the load balancer: round-robin, and a gateway that refuses the connection is skipped
(what a Service does once a pod is gone). Mid-run it SIGKILLs ``gateway-2``, then ``node-2`` (engine and agent),
each once enough requests succeeded (progress, not the clock, so a slow machine runs the same scenario).

Before the kills, a second key with ``rpm_limit`` = ``--rpm`` sends twice that many requests through both gateways
at once: the limit is shared through Redis, so the two together admit at most ``--rpm``, and the rest get 429 with
``Retry-After``.

Printed: the rate-limit check, requests served per gateway and per node (each engine's ``vllm:request_success_total``), every error with
its time relative to the kills, and the residency the control plane converges to. Exit status 1 when a request
failed that was not in flight on a killed process, when a survivor served nothing after the kill, or when residency
did not converge (every adapter resident on a live node, nothing routed to the dead one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from demo.api_client import upload_adapter, wait_validated  # noqa: E402
from demo.assets import ensure_demo_assets  # noqa: E402
from demo.run import node_process_env  # noqa: E402
from devtools.proc import free_port  # noqa: E402
from devtools.services import backing_services  # noqa: E402
from inference.node.launch import EngineConfig, engine_argv, engine_env  # noqa: E402
from workers import schedule  # noqa: E402

PY = sys.executable
REDIS_DB = 11  # the suite's worker uses db 0: separate queues
REQUEST_TIMEOUT_S = 180  # one 8-token completion; bounded, generous for 2 busy cores
STALE_AFTER_S = 10  # heartbeats every 1 s; a busy machine delays some by seconds (the gateway skips a refusing node at once)
ENGINE_START_TIMEOUT_S = float(os.environ.get("QUIVER_TEST_ENGINE_TIMEOUT", "600"))  # two engines on a busy machine


def say(msg: str) -> None:
    """Print one timestamped progress line."""
    print(f"[scaleout {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Processes:
    """Children in their own sessions (so a kill reaches vLLM's EngineCore and Worker), logs under one folder."""

    def __init__(self, log_dir: Path) -> None:
        """Keep logs under ``log_dir``."""
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        """Start ``argv`` as ``name``, output to ``<log_dir>/<name>.log``."""
        with (self.log_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def wait_http(self, name: str, url: str, timeout: float) -> None:
        """Wait until ``url`` answers 200; raise with the log tail if ``name`` dies or ``timeout`` (s) passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.procs[name].poll() is None:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} not ready at {url}:\n{self.tail(name)}")

    def tail(self, name: str, chars: int = 3000) -> str:
        """The end of ``name``'s log."""
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-chars:]

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and everything in its session (no graceful shutdown: a crash or a lost pod)."""
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        """SIGTERM every live child's session, SIGKILL what is left after 15 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A new database on the server of ``url`` (dropped afterwards); yields its URL."""
    import psycopg

    parts = urlsplit(url)
    name = f"scaleout_{secrets.token_hex(4)}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error as exc:  # e.g. InsufficientPrivilege ending a session it may not signal: figures stand
            print(f"could not drop database {name} ({exc}); drop it by hand", file=sys.stderr, flush=True)


@contextmanager
def fresh_bucket(env: dict[str, str]) -> Iterator[str]:
    """A new S3 bucket (emptied and removed afterwards); yields its name."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=env.get("AWS_S3_ENDPOINT_URL") or None,
                      aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                      aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"), region_name="us-east-1")
    name = f"scaleout-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=name, Key=obj["Key"])
        s3.delete_bucket(Bucket=name)


def redis_db(url: str, db: int) -> str:
    """``url`` pointing at Redis database ``db``."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py <args>``; its stdout."""
    return subprocess.run([PY, "manage.py", *args], cwd=REPO, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclass
class Outcome:
    """One client request: when (s since load start), through which gateway, for which model, and how it ended."""

    start: float
    end: float
    gateway: str
    model: str
    status: int  # 0 = no HTTP answer
    error: str


class LoadBalancer:
    """Round-robin over gateways, skipping one that refuses connections (a Service drops a dead pod)."""

    def __init__(self, gateways: dict[str, str]) -> None:
        """``gateways``: name → base URL."""
        self.gateways = gateways
        self.down: set[str] = set()
        self._order = itertools.cycle(sorted(gateways))
        self._lock = threading.Lock()

    def pick(self) -> str:
        """The next gateway that is not known to be down."""
        with self._lock:
            for _ in range(len(self.gateways)):
                name = next(self._order)
                if name not in self.down:
                    return name
        raise RuntimeError("no gateway left")

    def mark_down(self, name: str) -> None:
        """Stop sending to ``name``."""
        with self._lock:
            self.down.add(name)


class Load:
    """``concurrency`` client threads sending completions (the models in turn) through ``lb`` until ``stop()``."""

    def __init__(self, lb: LoadBalancer, api_key: str, models: list[str], *, concurrency: int) -> None:
        """Prepare the clients; ``start()`` starts them (the clock starts then too)."""
        self.lb, self.api_key = lb, api_key
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._models = itertools.cycle(models)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, name=f"client-{i}") for i in range(concurrency)]
        self.t0 = 0.0

    def now(self) -> float:
        """Seconds since ``start()``."""
        return time.monotonic() - self.t0

    def served(self, *, since: float = 0.0) -> Counter[str]:
        """Successful requests per gateway that started at or after ``since`` (s)."""
        with self._lock:
            return Counter(o.gateway for o in self.outcomes if o.status == 200 and o.start >= since)

    def start(self) -> None:
        """Start the clients."""
        self.t0 = time.monotonic()
        for thread in self._threads:
            thread.start()

    def stop(self) -> list[Outcome]:
        """Stop after the requests in flight end; every outcome, by start time."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return sorted(self.outcomes, key=lambda o: o.start)

    def _client(self) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {self.api_key}"}, timeout=REQUEST_TIMEOUT_S) as http:
            while not self._stop.is_set():
                with self._lock:
                    model = next(self._models)
                body = {"model": model, "prompt": "the quick brown", "max_tokens": 8, "temperature": 0}
                for _ in range(len(self.lb.gateways)):
                    name = self.lb.pick()
                    start = self.now()
                    try:
                        resp = http.post(self.lb.gateways[name] + "/v1/completions", json=body)
                        ok = resp.status_code == 200
                        error = "" if ok else f"{resp.status_code} {resp.text[:160]}"
                        outcome = Outcome(start, self.now(), name, model, resp.status_code, error)
                    except httpx.ConnectError:
                        self.lb.mark_down(name)  # nothing was sent: the balancer tries the next gateway
                        continue
                    except httpx.HTTPError as exc:
                        outcome = Outcome(start, self.now(), name, model, 0, type(exc).__name__)
                    with self._lock:
                        self.outcomes.append(outcome)
                    break


class EngineCounter:
    """Polls each engine's ``vllm:request_success_total``; keeps the last value read (a dead engine keeps its last)."""

    def __init__(self, engines: dict[str, str]) -> None:
        """``engines``: node name → engine URL."""
        self.engines = engines
        self.last: dict[str, float] = {name: 0.0 for name in engines}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-counter", daemon=True)

    def read(self, name: str) -> float | None:
        """The engine's current total of finished requests, or None if it does not answer."""
        try:
            text = httpx.get(self.engines[name] + "/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total"))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for name in self.engines:
                value = self.read(name)
                if value is not None:
                    self.last[name] = value

    def __enter__(self) -> EngineCounter:
        """Start polling."""
        for name in self.engines:
            self.last[name] = self.read(name) or 0.0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(timeout=5)


def rate_limit_check(urls: dict[str, str], model: str, *, secret: str, rpm: int) -> dict[str, Any]:
    """A key limited to ``rpm`` requests a minute (``secret``) sends at least ``2 x rpm`` requests, alternating the
    gateways, and more while the burst spans more fixed minutes than that exercises (at most ``6 x rpm``): the limit
    holds per window, so a burst that crossed a minute must outnumber ``rpm`` per window spanned to prove anything
    (CI: 24 requests over two windows of 12 were all a slow runner sent, and the check could not fail them).

    Returns:
        ``{"rpm_limit", "windows", "sent", "admitted": {gateway: n}, "rejected", "retry_after_on_all_429s", "other"}``;
        ``windows`` is how many fixed wall-clock minutes the burst spanned.
    """
    admitted: Counter[str] = Counter()
    rejected, retry_after, other, sent = 0, True, 0, 0
    if time.time() % 60 > 40:  # windows are fixed wall-clock minutes (inference.gateway.limits): start a fresh one
        time.sleep(60.5 - time.time() % 60)
    first_window = int(time.time() // 60)
    body = {"model": model, "prompt": "x", "max_tokens": 1}
    gateways = sorted(urls)
    with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=120) as http:
        while True:
            windows = int(time.time() // 60) - first_window + 1
            if (sent >= 2 * rpm and sent > rpm * windows) or sent >= 6 * rpm:
                break
            gateway = gateways[sent % len(gateways)]
            answer = http.post(urls[gateway] + "/v1/completions", json=body)
            sent += 1
            if answer.status_code == 200:
                admitted[gateway] += 1
            elif answer.status_code == 429:
                rejected += 1
                retry_after = retry_after and bool(answer.headers.get("retry-after"))
            else:
                other += 1
    return {"rpm_limit": rpm, "windows": windows, "sent": sent, "admitted": dict(admitted), "rejected": rejected,
            "retry_after_on_all_429s": retry_after, "other": other}


def residency() -> dict[str, Any]:
    """The control plane's view, read through the Django models (set up by the caller).

    Returns:
        ``{node name: {"live": bool, "adapters": {adapter name: tier}}}``; live = healthy with a fresh heartbeat.
    """
    from django.db import connections

    from adapters_app.models import BaseModel
    from inference.fleet.models import Node, Placement
    from inference.fleet.nodes import nodes_live

    live = {n.name for b in BaseModel.objects.all() for n in nodes_live(b)}
    nodes: dict[str, Any] = {node.name: {"live": node.name in live, "adapters": {}}
                             for node in Node.objects.order_by("name")}
    for p in Placement.objects.select_related("node", "adapter_version__adapter").order_by("node__name"):
        nodes[p.node.name]["adapters"][p.adapter_version.adapter.name] = p.tier
    connections.close_all()
    return nodes


def converged(view: dict[str, Any], adapters: list[str], dead: str) -> bool:
    """Every adapter is resident (warm/hot) on a live node, and the dead node is out of routing."""
    if view.get(dead, {}).get("live"):
        return False
    for adapter in adapters:
        if not any(n["live"] and n["adapters"].get(adapter) in {"warm", "hot"} for n in view.values()):
            return False
    return True


def _until(what: str, done: Callable[[], bool], deadline: float) -> bool:
    while not done():
        if time.monotonic() > deadline:
            say(f"gave up waiting for {what}")
            return False
        time.sleep(0.1)
    return True


def load_with_kills(gateways: dict[str, str], engines: dict[str, str], api_key: str, models: list[str], *,
                    kill_gateway: tuple[str, Callable[[], None]], kill_node: tuple[str, Callable[[], None]],
                    concurrency: int, served_before: int = 6, served_between: int = 6, served_after: int = 12,
                    timeout: float = 300) -> tuple[list[Outcome], dict[str, tuple[float, float]], dict[str, int]]:
    """Load through ``gateways``; kill by progress, not by the clock, so a slow machine runs the same scenario.

    The gateway dies once every gateway has served ``served_before`` requests and every engine some; the node once
    ``served_between`` more succeeded; the load stops once ``served_after`` requests begun after both kills
    succeeded, or at ``timeout`` s in all (the summary then fails on what is missing).

    Returns:
        ``(outcomes, kill windows {what: (signal sent, process gone)} in s since the load began,
        requests finished per engine {node: n} by its ``vllm:request_success_total``)``.
    """
    load = Load(LoadBalancer(gateways), api_key, models, concurrency=concurrency)
    windows: dict[str, tuple[float, float]] = {}
    deadline = time.monotonic() + timeout

    def kill(what: str, how: Callable[[], None]) -> float:
        sent = load.now()
        how()
        windows[what] = (sent, load.now())
        say(f"killed {what} at t={sent:.1f} s (gone at {windows[what][1]:.1f} s), served so far "
            f"{dict(load.served())}")
        return windows[what][1]

    with EngineCounter(engines) as counter:
        before = dict(counter.last)
        load.start()
        if _until("every gateway and engine to serve", lambda: all(load.served()[g] >= served_before for g in gateways)
                  and all(counter.last[n] > before[n] for n in engines), deadline):
            gone = kill(*kill_gateway)
            if _until("requests between the kills", lambda: sum(load.served(since=gone).values()) >= served_between,
                      deadline):
                gone = kill(*kill_node)
                _until("requests after the kills", lambda: sum(load.served(since=gone).values()) >= served_after,
                       deadline)
        outcomes = load.stop()
        time.sleep(0.5)
        served_by_node = {name: int(counter.last[name] - before[name]) for name in engines}
    return outcomes, windows, served_by_node


def await_convergence(adapters: list[str], dead: str, timeout: float) -> dict[str, Any]:
    """Poll ``residency()`` until ``converged`` or ``timeout`` s; the last view."""
    deadline = time.monotonic() + timeout
    view = residency()
    while not converged(view, adapters, dead) and time.monotonic() < deadline:
        time.sleep(1)
        view = residency()
    return view


def summarize(*, limits: dict[str, Any], outcomes: list[Outcome], kills: dict[str, tuple[float, float]],
              served_by_node: dict[str, int], view: dict[str, Any], adapters: list[str], killed_gateway: str,
              killed_node: str, gateways: list[str]) -> dict[str, Any]:
    """Judge one run. An error is explained when it was open on the killed gateway while it died, or open (through
    either gateway) while the killed node died; every other error fails the run.

    Returns:
        The summary dict (``ok`` plus the figures ``report`` prints).
    """
    missing = [name for name in (killed_gateway, killed_node) if name not in kills]
    windows = {name: kills.get(name, (float("inf"), float("inf"))) for name in (killed_gateway, killed_node)}

    def overlaps(o: Outcome, window: tuple[float, float]) -> bool:
        return o.start <= window[1] and o.end >= window[0]

    def at_kill(o: Outcome) -> bool:
        return (o.gateway == killed_gateway and overlaps(o, windows[killed_gateway])) or \
            overlaps(o, windows[killed_node])

    errors = [o for o in outcomes if o.status != 200]
    unexplained = [o for o in errors if not at_kill(o)]
    after = [] if missing else [o for o in outcomes if o.start > max(w[1] for w in windows.values())]
    served_by_gateway = dict(Counter(o.gateway for o in outcomes if o.status == 200))
    limit_ok = (sum(limits["admitted"].values()) <= limits["rpm_limit"] * limits["windows"] < limits["sent"]
                and limits["rejected"] > 0 and limits["retry_after_on_all_429s"] and limits["other"] == 0
                and all(limits["admitted"].get(g, 0) > 0 for g in gateways))
    summary: dict[str, Any] = {
        "rate_limit": limits,
        "rate_limit_ok": limit_ok,
        "requests": len(outcomes),
        "served_by_gateway": served_by_gateway,
        "served_by_node": served_by_node,
        "served_after_kills": sum(o.status == 200 for o in after),
        "requests_after_kills": len(after),
        "kills": windows,
        "kills_missing": missing,
        "killed": {"gateway": killed_gateway, "node": killed_node},
        "errors_at_kill": [asdict(o) for o in errors if at_kill(o)],
        "errors_unexplained": [asdict(o) for o in unexplained],
        "residency": view,
        "converged": converged(view, adapters, killed_node),
    }
    summary["ok"] = bool(limit_ok and not missing and not unexplained and summary["converged"] and summary["served_after_kills"] > 0
                         and all(served_by_gateway.get(g, 0) > 0 for g in gateways)
                         and all(v > 0 for v in served_by_node.values()))
    return summary


def report(summary: dict[str, Any]) -> list[str]:
    """The printed summary: rate limit, requests per gateway and node, errors at the kills, converged residency."""
    limits, kills, killed = summary["rate_limit"], summary["kills"], summary["killed"]
    lines = [
        f"scale-out proof: {summary['requests']} requests; {killed['gateway']} killed at "
        f"{kills[killed['gateway']][0]:.1f} s, {killed['node']} at {kills[killed['node']][0]:.1f} s; "
        f"{'PASS' if summary['ok'] else 'FAIL'}",
        f"rate limit {limits['rpm_limit']}/min on one key, {limits['sent']} requests through both gateways: "
        f"admitted {json.dumps(limits['admitted'])} in {limits['windows']} window(s), 429s {limits['rejected']} "
        f"(all with Retry-After: {limits['retry_after_on_all_429s']}), other {limits['other']}",
        "served per gateway: " + json.dumps(summary["served_by_gateway"]),
        "served per node (vllm:request_success_total): " + json.dumps(summary["served_by_node"]),
        f"served after both kills: {summary['served_after_kills']} of {summary['requests_after_kills']}",
        f"errors at the kills: {len(summary['errors_at_kill'])}; other errors: {len(summary['errors_unexplained'])}",
    ]
    for tag, key in (("at kill", "errors_at_kill"), ("UNEXPLAINED", "errors_unexplained")):
        for o in summary[key]:
            lines.append(f"  [{tag}] t={o['start']:.2f}-{o['end']:.2f} s via {o['gateway']} {o['model']}: "
                         f"{o['error'] or o['status']}")
    lines.append("residency (control plane):")
    for node, state in summary["residency"].items():
        tiers = ", ".join(f"{a}={t}" for a, t in sorted(state["adapters"].items())) or "-"
        lines.append(f"  {node}: {'live' if state['live'] else 'out of routing'}; {tiers}")
    lines.append(f"converged: {summary['converged']}")
    return lines


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear scenario
    """Run the proof; see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--served-before", type=int, default=6, help="requests each gateway serves before a kill")
    parser.add_argument("--served-after", type=int, default=12, help="requests served after both kills")
    parser.add_argument("--timeout", type=float, default=300, help="seconds of load at most")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rpm", type=int, default=12, help="requests-per-minute limit of the rate-limit check")
    parser.add_argument("--workdir", type=Path, default=REPO / ".cache" / "scaleout")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Django's root INFO logging would print every request

    assets = ensure_demo_assets()
    adapters = sorted(assets.adapters)[:2]
    (args.workdir / "logs").mkdir(parents=True, exist_ok=True)
    procs = Processes(args.workdir / "logs")
    with ExitStack() as stack:
        env = {**os.environ}
        env.update(stack.enter_context(backing_services(env)))
        stack.callback(procs.stop_all)
        env["DATABASE_URL"] = stack.enter_context(fresh_database(env["DATABASE_URL"]))
        env["AWS_STORAGE_BUCKET_NAME"] = stack.enter_context(fresh_bucket(env))
        env["REDIS_URL"] = env["CELERY_BROKER_URL"] = redis_db(env["REDIS_URL"], REDIS_DB)
        env.update({
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
            "QUIVER_API_KEY_HMAC_KEY": secrets.token_urlsafe(48),
            "QUIVER_NODE_SECRET": secrets.token_urlsafe(48),
            "QUIVER_NODE_STALE_AFTER_S": str(STALE_AFTER_S),
            "QUIVER_WARM_WAIT_S": "60",
        })
        say("migrating a fresh database, registering the tiny base model and a tenant")
        manage(env, "migrate", "--noinput")
        manage(env, "quiver_base_model_register", assets.served_name, str(assets.base_dir), "--max-lora-rank", "16")
        api_key = manage(env, "quiver_tenant_create", "scaleout", "--name", "Scale-out").splitlines()[-1]

        ports = {name: free_port() for name in ("web", "web-internal", "gateway-1", "gateway-2")}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        engines: dict[str, str] = {}
        agents: dict[str, str] = {}
        say("registering 2 nodes; starting web, web-internal, 2 gateways, 2 workers, 2 vLLM CPU nodes, 2 agents")
        for name, port in ports.items():
            app = "config.internal_asgi:application" if name == "web-internal" else "config.asgi:application"
            procs.start(name, [PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warning"], env)
        for i in (1, 2):
            node, agent_url = f"node-{i}", f"http://127.0.0.1:{free_port()}"
            engine_port = free_port()
            creds = dict(line.split("=", 1) for line in manage(
                env, "quiver_node_register", node, "--agent-url", agent_url, "--engine-url",
                f"http://127.0.0.1:{engine_port}", "--base-model", assets.served_name).splitlines() if "=" in line)
            procs.start(f"worker-{i}", [PY, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                        "--concurrency=2", "-Q", ",".join(schedule.ALL_QUEUES),
                                        "-n", f"scaleout-{i}@%h", "--loglevel=WARNING"], env)
            engine = EngineConfig.cpu_dev(assets.base_dir, assets.served_name, port=engine_port,
                                          api_key=creds["QUIVER_NODE_KEY"])
            engines[node], agents[node] = engine.url, agent_url
            node_env = node_process_env(env)  # a node holds only its own pair, and no S3 key
            procs.start(f"engine-{i}", engine_argv(engine, python=PY), engine_env(engine, node_env))
            agent_env = {
                **node_env, **creds, "QUIVER_ENGINE_URL": engine.url, "QUIVER_BASE_MODEL": assets.served_name,
                "QUIVER_NODE_CACHE_DIR": str(args.workdir / f"cache-{i}"), "QUIVER_AGENT_URL": agent_url,
                "QUIVER_CONTROL_URL": urls["web-internal"], "QUIVER_HEARTBEAT_SECONDS": "1",
                "QUIVER_MAX_LORAS": "2", "QUIVER_MAX_CPU_LORAS": "4", "QUIVER_MAX_LORA_RANK": "16"}
            procs.start(f"agent-{i}", [PY, "-m", "uvicorn", "inference.node.agent:app", "--host", "127.0.0.1",
                                       "--port", agent_url.rsplit(":", 1)[1], "--log-level", "warning"], agent_env)
        for name, url in urls.items():
            procs.wait_http(name, url + "/healthz", 90)
        for i, node in enumerate(engines, start=1):
            procs.wait_http(f"engine-{i}", engines[node] + "/health", ENGINE_START_TIMEOUT_S)
            procs.wait_http(f"agent-{i}", agents[node] + "/healthz", 60)

        api = stack.enter_context(httpx.Client(base_url=urls["web"], timeout=120,
                                               headers={"Authorization": f"Bearer {api_key}"}))
        os.environ.update(env)
        import django

        django.setup()
        deadline = time.monotonic() + 60
        while len([n for n in residency().values() if n["live"]]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the two nodes never both reported live")
            time.sleep(0.5)
        for name in adapters:
            version = wait_validated(api, name, upload_adapter(api, name, assets.adapters[name],
                                                                base_model=assets.served_name)["number"])
            if version["status"] != "ready":
                raise RuntimeError(f"{name} was rejected: {version['validation_report']}")
        models = [assets.served_name, *adapters]
        gateways = {"gateway-1": urls["gateway-1"], "gateway-2": urls["gateway-2"]}
        for url in gateways.values():  # warm every adapter and each gateway's caches
            for model in models:
                answer = api.post(url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
                answer.raise_for_status()
        say(f"adapters {', '.join(adapters)} ready and warm; load through both gateways")

        created = api.post("/api/v1/api-keys", json={"name": "rate-limited", "scopes": ["inference"]})
        created.raise_for_status()
        limited = created.json()
        api.patch(f"/api/v1/api-keys/{limited['key_id']}", json={"rpm_limit": args.rpm}).raise_for_status()
        limits = rate_limit_check(gateways, assets.served_name, secret=limited["secret"], rpm=args.rpm)
        say(f"rate limit across both gateways: {json.dumps(limits)}")

        def kill_node() -> None:
            procs.kill("engine-2")
            procs.kill("agent-2")

        outcomes, windows, served_by_node = load_with_kills(
            gateways, engines, api_key, models, kill_gateway=("gateway-2", lambda: procs.kill("gateway-2")),
            kill_node=("node-2", kill_node), concurrency=args.concurrency, served_before=args.served_before,
            served_after=args.served_after, timeout=args.timeout)
        view = await_convergence(adapters, "node-2", 30)

    summary = summarize(limits=limits, outcomes=outcomes, kills=windows, served_by_node=served_by_node, view=view,
                        adapters=adapters, killed_gateway="gateway-2", killed_node="node-2", gateways=sorted(gateways))
    print("\n" + "\n".join(report(summary)))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
