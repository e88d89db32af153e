"""The node agent: an ASGI app next to one vLLM engine, driven by the control plane.

Run: `uvicorn inference.node.agent:app --host 0.0.0.0 --port 8100` with the env described in
`inference.node.config.NodeSettings`. Every route except `/healthz` and `/metrics` needs
`Authorization: Bearer <QUIVER_NODE_KEY>`, checked before the body is read (`BodyGuard`); bodies over
`MAX_BODY_BYTES` are 413 `request_too_large`. Errors are `{"detail": str, "code": str}`.

Routes (a fixed contract with the control plane):
- `POST /v1/adapters/load` `{"lora_name", "lora_int_id", "files": [{"name", "s3_key", "url", "sha256", "size"}], "pin",
  "expect_effect"}` -> `{"lora_name", "lora_int_id", "tier" (engine's own: "hot" | "warm"), "pinned", "download_ms",
  "load_ms", "effect", "evicted"}`
- `POST /v1/adapters/unload` `{"lora_name", "purge"}` -> `{"lora_name", "tier": "staged"}` (`"cold"` with purge)
- `POST /v1/adapters/pin` `{"lora_name"}` -> `{"lora_name", "lora_int_id", "tier": "warm", "pinned": true}`
- `POST /v1/eviction_policy` `{"policy": "lru" | "lfu" | "cost"}` -> `{"policy"}`: this node's victim order, here and
  in the engine, until the agent restarts (`NodeAgent.set_eviction_policy`)
- `GET /v1/state` -> see `NodeAgent.state`
- `GET /metrics` (no auth) -> Prometheus gauges of residency per tier and of the engine load the agent publishes
  for admission (`inference.node.residency_metrics`)
- `GET /healthz` (no auth) -> 200 `{"status": "ok"}` when the engine's `/health` answers, else 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

import httpx
import redis.asyncio as aioredis
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inference.logfmt import configure as configure_logging
from inference.node import residency_metrics
from inference.node.cache import AdapterCache, FileSpec
from inference.node.config import ConfigError, NodeSettings
from inference.node.engine_client import EngineHTTPClient
from inference.node.engine_scrape import EngineScraper
from inference.node.heartbeat import heartbeat_loop
from inference.node.load_publisher import LoadPublisher
from inference.node.service import AgentError, NodeAgent

logger = logging.getLogger(__name__)

# add_lora reads the adapter from disk inside the engine; large adapters take seconds.
ENGINE_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
HEARTBEAT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# The largest body a route takes is a load's (two file entries, well under 4 KiB); anything past this is refused 413.
MAX_BODY_BYTES = 1 << 20
# Served without the node key (liveness and Prometheus' scrape).
OPEN_PATHS = frozenset({"/healthz", "/metrics"})


class FileIn(BaseModel):
    """One adapter file to stage."""

    name: str = Field(min_length=1, max_length=200)
    s3_key: str = Field(min_length=1, max_length=1024)
    # A presigned GET of s3_key (the node holds no S3 credential); SigV4 query URLs run ~600-1,500 characters.
    url: str = Field(min_length=1, max_length=8192)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class LoadIn(BaseModel):
    """Body of `POST /v1/adapters/load`."""

    lora_name: str = Field(min_length=1, max_length=200)
    lora_int_id: int = Field(ge=1)
    files: list[FileIn] = Field(min_length=1)
    pin: bool = False
    # False when validation warned the adapter is untrained: a no-effect probe then does not fail the load.
    expect_effect: bool = True


class NameIn(BaseModel):
    """Body of pin."""

    lora_name: str = Field(min_length=1, max_length=200)


class PolicyIn(BaseModel):
    """Body of eviction_policy."""

    policy: str = Field(min_length=1, max_length=20)


class UnloadIn(NameIn):
    """Body of unload: `purge` also deletes the staged files (the adapter was deleted)."""

    purge: bool = False


_bearer = HTTPBearer(auto_error=False)


async def require_node_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """FastAPI dependency: the request must carry `Authorization: Bearer <QUIVER_NODE_KEY>`.

    Raises:
        AgentError: 401 `unauthorized`.
    """
    token = credentials.credentials if credentials else ""
    digest = hashlib.sha256(token.encode("utf-8")).digest()
    if not token or not hmac.compare_digest(digest, request.app.state.node_key_digest):
        raise AgentError(401, "unauthorized", "A valid node key is required.")


def _key_matches(headers: Headers, key_digest: bytes) -> bool:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(hashlib.sha256(token.encode("utf-8")).digest(), key_digest)


class BodyGuard:
    """Pure ASGI middleware: the node key and the body's size are checked before a byte of the body is read.

    FastAPI reads and JSON-parses a route's body before its dependencies run, so with ``require_node_key`` alone
    anyone who reached the agent's port could make it buffer and parse a body of any size before the 401. Here a
    request without the key is answered 401 unread, and a body over ``MAX_BODY_BYTES`` (declared, or once that many
    bytes have come) 413. ``require_node_key`` stays on the routes as well.
    """

    def __init__(self, app: ASGIApp, key_digest: bytes) -> None:
        self.app = app
        self.key_digest = key_digest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 401/413 without reading the body, or pass the request on with its body read (at most the cap)."""
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not _key_matches(headers, self.key_digest):
            await _error(401, "unauthorized", "A valid node key is required.",
                         {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large()(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > MAX_BODY_BYTES:
                await _too_large()(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _too_large() -> JSONResponse:
    return _error(413, "request_too_large", f"Request body over {MAX_BODY_BYTES} bytes; the agent's routes take "
                  "small JSON bodies (a load names its files, it does not carry them).")


def _describe(err: Mapping[str, Any]) -> str:
    location = ".".join(str(part) for part in err.get("loc", ()))
    return f"{location}: {err.get('msg')}"


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


def create_app(settings: NodeSettings) -> FastAPI:
    """Build the agent app.

    Args:
        settings: node settings.

    Returns:
        The FastAPI app. Its lifespan opens the engine HTTP client and starts the heartbeat task when
        `settings.control_url` is set; `app.state.agent` is the `NodeAgent` once started.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = AdapterCache(settings.cache_dir, s3_origin=settings.s3_endpoint_url,
                             max_bytes=settings.cache_max_bytes)
        async with (
            httpx.AsyncClient(base_url=settings.engine_url, timeout=ENGINE_TIMEOUT) as engine_http,
            httpx.AsyncClient(timeout=HEARTBEAT_TIMEOUT) as control_http,
            EngineScraper(settings.engine_url, settings.node_key) as scraper,
        ):
            agent = NodeAgent(settings, cache, EngineHTTPClient(engine_http, settings.node_key))
            app.state.agent = agent
            redis = aioredis.Redis.from_url(settings.load_redis_url, socket_timeout=1) if settings.load_redis_url \
                else None
            publisher = LoadPublisher(scraper.metrics_text, redis, settings.node_name,
                                      interval_s=settings.load_publish_s,
                                      scheduling_policy=settings.scheduling_policy)
            app.state.load_publisher = publisher
            publish_task = asyncio.create_task(publisher.run_forever())
            task: asyncio.Task[None] | None = None
            if settings.control_url:
                task = asyncio.create_task(
                    heartbeat_loop(
                        control_http,
                        settings.control_url,
                        settings.node_token,
                        agent.state,
                        settings.heartbeat_seconds,
                        agent.note_plan,
                    )
                )
            logger.info(
                "agent.started",
                extra={
                    "node": settings.node_name,
                    "engine_url": settings.engine_url,
                    "heartbeat": bool(task),
                },
            )
            try:
                yield
            finally:
                for running in (task, publish_task):
                    if running is not None:
                        running.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await running
                if redis is not None:
                    await redis.aclose()

    app = FastAPI(
        title="Quiver node agent", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.node_key_digest = hashlib.sha256(settings.node_key.encode("utf-8")).digest()
    app.add_middleware(BodyGuard, key_digest=app.state.node_key_digest)

    def agent_of(request: Request) -> NodeAgent:
        return request.app.state.agent

    auth = [Depends(require_node_key)]

    @app.exception_handler(AgentError)
    async def agent_error(_: Request, exc: AgentError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.code, exc.detail, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [_describe(err) for err in exc.errors()]
        return _error(400, "invalid_request", "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.post("/v1/adapters/load", dependencies=auth)
    async def load(body: LoadIn, request: Request) -> dict[str, Any]:
        files = [FileSpec(f.name, f.s3_key, f.sha256, f.size, f.url) for f in body.files]
        result = await agent_of(request).load(body.lora_name, body.lora_int_id, files, pin=body.pin,
                                              expect_effect=body.expect_effect)
        return result.as_json()

    @app.post("/v1/adapters/unload", dependencies=auth)
    async def unload(body: UnloadIn, request: Request) -> dict[str, Any]:
        return await agent_of(request).unload(body.lora_name, purge=body.purge)

    @app.post("/v1/adapters/pin", dependencies=auth)
    async def pin(body: NameIn, request: Request) -> dict[str, Any]:
        return await agent_of(request).pin(body.lora_name)

    @app.post("/v1/eviction_policy", dependencies=auth)
    async def eviction_policy(body: PolicyIn, request: Request) -> dict[str, Any]:
        return await agent_of(request).set_eviction_policy(body.policy)

    @app.get("/v1/state", dependencies=auth)
    async def state(request: Request) -> dict[str, Any]:
        return await agent_of(request).state()

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        # Aggregates only (no adapter names), so Prometheus scrapes it without the node key, like /healthz.
        return Response(residency_metrics.render(await agent_of(request).state(),
                                                 load=request.app.state.load_publisher),
                        media_type=residency_metrics.CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        if await agent_of(request).engine.health():
            return JSONResponse({"status": "ok"})
        return _error(503, "engine_unavailable", "engine /health did not answer 200")

    return app


class _AppFromEnv:
    """ASGI app that builds `create_app(NodeSettings.from_env(os.environ))` on its first event.

    Lets `uvicorn inference.node.agent:app` work while keeping imports free of env reads (tests import
    this module without the env). A missing variable fails the lifespan startup with `ConfigError`.
    """

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            configure_logging(os.environ.get("QUIVER_LOG_LEVEL", "INFO"))
            try:
                self._app = create_app(NodeSettings.from_env(os.environ))
            except ConfigError as exc:
                if scope["type"] != "lifespan":
                    raise
                # Fail the server start (uvicorn exits) instead of uvicorn's "lifespan unsupported" fallback.
                await receive()
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
        await self._app(scope, receive, send)


app = _AppFromEnv()
