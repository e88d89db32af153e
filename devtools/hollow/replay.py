"""The scale run's load and side measurements: an open-loop replay of a trace through the gateways, console/API page
timings, and the process tree's memory.

Open loop: request ``i`` is sent at ``trace.times[i]`` seconds after the start whatever happened to the ones before
(a closed loop would slow down with the system and hide its queueing). Requests alternate over the gateways, each
with its tenant's key and ``model`` = its adapter's name; the gateway streams from the engine either way.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import httpx
import psutil


@dataclass
class ReplayResult:
    """What the replay saw.

    Attributes:
        statuses: HTTP status per request (0 = no answer).
        latencies_ms: end-to-end time of each answered request.
        lag_ms: how late each request left against its schedule (the client's own lag).
        wall_s: seconds from the first to the last answer.
        errors: a few error bodies, by status.
    """

    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: dict[int, str] = field(default_factory=dict)


async def _replay(times: Sequence[float], requests: Sequence[tuple[str, str]], gateways: Sequence[str], *,
                  max_tokens: int, timeout_s: float) -> ReplayResult:
    result = ReplayResult()
    order = itertools.cycle(gateways)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()

        async def one(i: int, gateway: str) -> None:
            key, model = requests[i]
            sent = time.monotonic()
            result.lag_ms.append((sent - started - times[i]) * 1000)
            body = {"model": model, "prompt": f"request {i} for {model}", "max_tokens": max_tokens}
            try:
                async with session.post(gateway + "/v1/completions", json=body,
                                        headers={"Authorization": f"Bearer {key}"}) as answer:
                    text = await answer.text()
                    status = answer.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, text = 0, repr(exc)
            result.statuses[status] += 1
            if status == 200:
                result.latencies_ms.append((time.monotonic() - sent) * 1000)
            elif status not in result.errors:
                result.errors[status] = text[:300]

        tasks = []
        for i, t in enumerate(times):
            delay = started + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, next(order))))
        await asyncio.gather(*tasks)
        result.wall_s = time.monotonic() - started
    return result


def replay(times: Sequence[float], requests: Sequence[tuple[str, str]], gateways: Sequence[str], *,
           max_tokens: int = 16, timeout_s: float = 120.0) -> ReplayResult:
    """Send ``requests[i]`` = ``(api key, model)`` at ``times[i]`` s through ``gateways`` in turn; block until done."""
    return asyncio.run(_replay(times, requests, gateways, max_tokens=max_tokens, timeout_s=timeout_s))


class Sampler(threading.Thread):
    """Calls ``fn`` every ``every_s`` seconds in the background until ``stop()``; exceptions are counted, not raised.

    Args:
        fn: the work.
        every_s: the period.
    """

    def __init__(self, fn: Callable[[], None], every_s: float) -> None:
        super().__init__(daemon=True)
        self.fn, self.every_s = fn, every_s
        self._stop_event = threading.Event()
        self.failures = 0

    def run(self) -> None:
        """Loop until stopped."""
        while not self._stop_event.wait(self.every_s):
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - a sampler must not end the run
                self.failures += 1

    def stop(self) -> None:
        """Stop and wait for the thread."""
        self._stop_event.set()
        self.join(timeout=30)


def tree_rss_bytes(root_pid: int) -> int:
    """Resident memory of ``root_pid`` and every descendant (children in their own sessions included)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def operator_client(web: str, password: str, username: str = "operator") -> httpx.Client:
    """A staff console session on ``web`` (the operator pages need one; tenant keys get 403): the session cookie
    and the CSRF header set.

    Raises:
        httpx.HTTPStatusError: the login was refused (wrong password, or not a user).
    """
    client = httpx.Client(base_url=web, timeout=60)
    client.get("/api/v1/auth/session")
    csrf = client.cookies.get("csrftoken", "")
    answer = client.post("/api/v1/auth/login", json={"username": username, "password": password},
                         headers={"X-CSRFToken": csrf} if csrf else {})
    answer.raise_for_status()
    if client.cookies.get("csrftoken"):
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    return client


class PageTimer:
    """Times the console's API pages: a tenant's adapter list, the operator's nodes (the Fleet page's first page) and
    residency map (its first page of versions), and the traffic over the run's usage (``/api/v1/usage/traffic`` for
    a tenant, ``/api/v1/operator/traffic`` for staff).

    Args:
        web_url: the web process.
        tenant_key: a tenant's API key.
        operator: an ``httpx.Client`` logged in as staff (its session cookie and CSRF header set).
    """

    def __init__(self, web_url: str, tenant_key: str, operator: httpx.Client) -> None:
        self.tenant = httpx.Client(base_url=web_url, timeout=60, headers={"Authorization": f"Bearer {tenant_key}"})
        self.operator = operator
        self.samples: dict[str, list[float]] = {}
        self.failures: Counter[str] = Counter()

    def _time(self, name: str, client: httpx.Client, path: str) -> None:
        started = time.perf_counter()
        answer = client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        if answer.status_code == 200:
            self.samples.setdefault(name, []).append(elapsed)
        else:
            self.failures[f"{name}:{answer.status_code}"] += 1

    def once(self) -> None:
        """One round of every page."""
        self._time("adapters", self.tenant, "/api/v1/adapters")
        self._time("usage_traffic", self.tenant, "/api/v1/usage/traffic")
        self._time("operator_nodes", self.operator, "/api/v1/operator/nodes?limit=12")  # as the Fleet page asks
        self._time("operator_residency", self.operator, "/api/v1/operator/residency")
        self._time("operator_traffic", self.operator, "/api/v1/operator/traffic")
