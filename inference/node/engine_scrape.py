"""The agent's frequent read of its engine's ``/metrics`` (``inference.node.load_publisher``, every 100 ms), over
aiohttp rather than the agent's httpx client.

Why a second client: httpx costs about 1.3 ms of CPU per request against 0.16 ms for aiohttp on the same 22 KB body
and loopback server (``scripts/bench_scrape.py``), and this read runs ten times a second on every node: with httpx it
was the largest part of an agent's CPU at idle (py-spy, docs/scale.md "Node agents: the load scrape"). The engine's
other routes stay on ``EngineHTTPClient`` (httpx), where a call is rare and its cost does not matter.
"""

from __future__ import annotations

import aiohttp

from inference.node.engine_client import EngineError

SCRAPE_TIMEOUT_S = 2.0  # several missed scrapes already make the gateway treat the node's figures as stale


class EngineScraper:
    """``GET /metrics`` on one engine through one kept-alive aiohttp session.

    Args:
        engine_url: the engine's base URL (``http://host:port``).
        api_key: the node key, sent as ``Authorization: Bearer`` (vLLM serves ``/metrics`` outside its key-guarded
            ``/v1`` prefix, the hollow engine too; sent anyway so a guarded proxy in front still answers).
        timeout_s: the whole request's limit, seconds.

    Use as an async context manager; ``metrics_text`` outside it raises ``RuntimeError``.
    """

    def __init__(self, engine_url: str, api_key: str, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.url = engine_url.rstrip("/") + "/metrics"
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EngineScraper:
        # One connection is enough (the scrapes never overlap); no proxy from the environment on a node-local hop.
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers,
                                              connector=aiohttp.TCPConnector(limit=1))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def metrics_text(self) -> str:
        """The engine's ``/metrics`` body (Prometheus text).

        Raises:
            EngineError: 503 ``engine_unavailable`` when unreachable or timed out; the engine's status with
                ``engine_error`` on a non-200 answer.
            RuntimeError: outside ``async with``.
        """
        if self._session is None:
            raise RuntimeError("EngineScraper used outside `async with`")
        try:
            async with self._session.get(self.url) as response:
                if response.status != 200:
                    raise EngineError(response.status, "engine_error", f"metrics answered {response.status}")
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(503, "engine_unavailable", f"engine unreachable: {exc!r}") from exc
