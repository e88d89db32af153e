"""Upstream calls to a node's vLLM OpenAI server: rewrite ``model``, stream SSE through, collect ``usage``.

Each node's own key (``inference.gateway.node_client.node_key``, vLLM's ``VLLM_API_KEY`` there) is added here; tenants never hold it, so the engine's
LoRA load/unload routes stay out of their reach (shared/notes/anchors.md §3 "Security", sglang#26789).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from django.conf import settings


def upstream_headers(node_key: str) -> dict[str, str]:
    """Headers for engine calls: the node's key as bearer token, JSON body."""
    return {"Authorization": f"Bearer {node_key}", "Content-Type": "application/json"}


def rename_model(text: str, served: str, requested: str) -> str:
    """Replace the internal served name with the tenant's name in engine text (errors, bodies)."""
    return text.replace(served, requested) if served != requested else text


async def open_upstream(engine_url: str, endpoint: str, body: dict[str, Any], *,
                        node_key: str) -> tuple[httpx.AsyncClient, httpx.Response]:
    """Send ``body`` to ``engine_url/v1/<endpoint>`` with streaming enabled; the caller closes both objects.

    Raises:
        httpx.HTTPError: the engine could not be reached.
    """
    client = httpx.AsyncClient(timeout=httpx.Timeout(settings.QUIVER_PROXY_TIMEOUT_S, connect=5.0))
    try:
        request = client.build_request("POST", f"{engine_url.rstrip('/')}/v1/{endpoint}", json=body,
                                       headers=upstream_headers(node_key))
        response = await client.send(request, stream=True)
    except BaseException:
        await client.aclose()
        raise
    return client, response


async def relay_sse(
    client: httpx.AsyncClient, response: httpx.Response, *, served: str, requested: str, keep_usage: bool,
    on_done: Callable[[dict[str, Any] | None], Any],
) -> AsyncIterator[bytes]:
    """Relay an engine SSE stream, rewriting each chunk's ``model`` and capturing the final ``usage``.

    The gateway always asks the engine for ``stream_options.include_usage`` (to meter); ``keep_usage`` says whether
    the client asked for it too, else the usage-only chunk is dropped. ``on_done(usage)`` runs once: before
    ``[DONE]`` is relayed, or at the end if the stream stops early.
    """
    usage: dict[str, Any] | None = None
    recorded = False
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                # Meter before the client sees the end, so usage is visible once the stream is read.
                recorded = True
                await on_done(usage)
                yield b"data: [DONE]\n\n"
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                yield f"data: {rename_model(payload, served, requested)}\n\n".encode()
                continue
            if chunk.get("usage"):
                usage = chunk["usage"]
            if not keep_usage:
                if chunk.get("usage") and not chunk.get("choices"):
                    continue
                chunk.pop("usage", None)
            if "model" in chunk:
                chunk["model"] = requested
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
    finally:
        await response.aclose()
        await client.aclose()
        if not recorded:  # client went away or the engine ended without [DONE]
            await on_done(usage)
