"""A bare pass-through to one engine: the floor any proxy pays on this machine, for ``scripts/bench_gateway``.

uvicorn (as the gateway runs it) receives the request, the model name is mapped to the engine's ``lora_name``, the
body goes to the engine through one pooled aiohttp session (as the gateway's ``upstream`` does), and the engine's
bytes go back unread. No keys, limits, admission, routing or metering: what the gateway adds over this is its own
cost, and what this adds over the engine is the cost of the extra hop itself.

Run: ``PASSTHROUGH_ENGINE_URL=http://… PASSTHROUGH_NODE_KEY=… PASSTHROUGH_MODELS='{"name": "lora_name"}'
uvicorn devtools.passthrough:app``. A benchmark tool only: it checks nothing and must never face clients.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp

Message = MutableMapping[str, Any]
_session: list[aiohttp.ClientSession] = []
_MODELS: dict[str, str] = json.loads(os.environ.get("PASSTHROUGH_MODELS", "{}"))


async def app(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]],
              send: Callable[[Message], Awaitable[None]]) -> None:
    """ASGI: relay a request to ``PASSTHROUGH_ENGINE_URL`` + the same path, a JSON body's ``model`` mapped."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        if _session:
            await _session.pop().close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    if not _session:
        _session.append(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, limit_per_host=0, keepalive_timeout=4.0),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False))
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if body:
        data = json.loads(body)
        data["model"] = _MODELS.get(data.get("model"), data.get("model"))
        body = json.dumps(data).encode()
    headers = {"Authorization": f"Bearer {os.environ['PASSTHROUGH_NODE_KEY']}", "Content-Type": "application/json"}
    async with _session[0].request(scope["method"], os.environ["PASSTHROUGH_ENGINE_URL"] + scope["path"],
                                   data=body or None, headers=headers) as upstream:
        await send({"type": "http.response.start", "status": upstream.status,
                    "headers": [(b"content-type", upstream.headers.get("Content-Type", "").encode())]})
        async for chunk in upstream.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
