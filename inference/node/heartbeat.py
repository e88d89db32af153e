"""Periodic heartbeat from the node agent to the control plane."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

logger = logging.getLogger(__name__)

HEARTBEAT_PATH = "/internal/v1/nodes/heartbeat"


async def send_heartbeat(
    http: httpx.AsyncClient, control_url: str, node_key: str, state: dict[str, Any]
) -> dict[str, Any] | None:
    """POST one state report to `{control_url}/internal/v1/nodes/heartbeat`.

    Args:
        http: client to send with.
        control_url: control-plane base URL, no trailing slash.
        node_key: the node's heartbeat token (`QUIVER_NODE_TOKEN`), sent as `Authorization: Bearer`.
        state: the `/v1/state` body.

    Returns:
        The control plane's JSON answer (``{"node", "healthy", "elsewhere"}``, ``{}`` when it is not a JSON object)
        on a 2xx answer. Failures are logged and return None; they never raise.
    """
    try:
        response = await http.post(
            control_url + HEARTBEAT_PATH,
            json=state,
            headers={"Authorization": f"Bearer {node_key}"},
        )
    except httpx.HTTPError as exc:
        logger.warning("heartbeat.failed", extra={"control_url": control_url, "error": str(exc)})
        return None
    if response.status_code >= 300:
        logger.warning(
            "heartbeat.rejected",
            extra={"control_url": control_url, "status": response.status_code, "answer": response.text[:500]},
        )
        return None
    try:
        answer = response.json()
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


async def heartbeat_loop(
    http: httpx.AsyncClient,
    control_url: str,
    node_key: str,
    get_state: Callable[[], Awaitable[dict[str, Any]]],
    interval_s: float,
    on_answer: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Send a heartbeat every `interval_s` seconds until cancelled; no error ends the loop.

    Args:
        http: client to send with.
        control_url: control-plane base URL.
        node_key: the node's heartbeat token.
        get_state: coroutine function building the state report.
        interval_s: seconds between heartbeats (`QUIVER_HEARTBEAT_SECONDS`).
        on_answer: called with each accepted heartbeat's answer (``send_heartbeat``'s return).
    """
    while True:
        try:
            answer = await send_heartbeat(http, control_url, node_key, await get_state())
            if answer is not None and on_answer is not None:
                on_answer(answer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken state read must not stop heartbeats
            logger.warning("heartbeat.state_failed", extra={"error": str(exc)})
        await asyncio.sleep(interval_s)
