"""The gateway process's one pooled HTTP client to the engines (keep-alive; pool size ``QUIVER_GATEWAY_UPSTREAM_POOL``).

A new ``httpx.AsyncClient`` per request cost about 45 ms here (it builds a TLS context each time) and a fresh TCP
connection each time (issue 7 "Why"). The client is bound to the event loop that made it, so one is kept per loop.
Each node's own key (``inference.gateway.node_client.node_key``, its engine's ``VLLM_API_KEY``) goes on each request
(:func:`upstream_headers`); tenants never hold it.
"""

from __future__ import annotations

import asyncio

import httpx
from django.conf import settings

# Below uvicorn's (and so vLLM's) 5 s keep-alive timeout: reusing a connection the engine is closing fails the request.
UPSTREAM_KEEPALIVE_S = 4.0
_clients: dict[int, httpx.AsyncClient] = {}


def upstream_client() -> httpx.AsyncClient:
    """The pooled client of the running event loop (created on first use)."""
    loop_id = id(asyncio.get_running_loop())
    client = _clients.get(loop_id)
    if client is None or client.is_closed:
        pool = settings.QUIVER_GATEWAY_UPSTREAM_POOL
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.QUIVER_PROXY_TIMEOUT_S, connect=5.0),
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool, keepalive_expiry=UPSTREAM_KEEPALIVE_S),
            trust_env=False,
        )
        _clients[loop_id] = client
    return client


async def upstream_close() -> None:
    """Close the running loop's client (lifespan shutdown)."""
    client = _clients.pop(id(asyncio.get_running_loop()), None)
    if client is not None:
        await client.aclose()


def upstream_headers(node_key: str) -> dict[str, str]:
    """Headers for an engine call: the node's key as bearer token, JSON body."""
    return {"Authorization": f"Bearer {node_key}", "Content-Type": "application/json"}
