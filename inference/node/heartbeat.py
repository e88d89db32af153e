"""Periodic heartbeat from the node agent to the control plane."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

logger = logging.getLogger(__name__)

HEARTBEAT_PATH = "/internal/v1/nodes/heartbeat"
# Each wait is the interval times a factor drawn from [1 - J, 1 + J]. Agents started together (a host's or a rollout's
# nodes, a power event) otherwise beat in lock step for ever, and their accepts queue behind each other in the
# listener: at 64 emulated nodes started per host, heartbeat p99 was 582 ms for 23 ms of CPU (docs/scale.md). The
# field's pattern: Kubernetes' ``wait.JitterUntil`` (k8s.io/apimachinery/pkg/util/wait), AWS Architecture Blog
# "Exponential Backoff And Jitter". Symmetric, so the mean interval (and the control plane's staleness timer, a few
# intervals) is unchanged, and 0.8 x the interval stays above the listener's floor (QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S).
HEARTBEAT_JITTER = 0.2


def heartbeat_wait_s(interval_s: float, draw: float) -> float:
    """Seconds to wait before the next heartbeat: ``interval_s`` x (1 - J + 2 J ``draw``), J = ``HEARTBEAT_JITTER``.

    Args:
        interval_s: the configured interval (``QUIVER_HEARTBEAT_SECONDS``), seconds.
        draw: a uniform draw in [0, 1).
    """
    return interval_s * (1.0 - HEARTBEAT_JITTER + 2.0 * HEARTBEAT_JITTER * draw)


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
    draw: Callable[[], float] = random.random,
) -> None:
    """Send a heartbeat about every `interval_s` seconds until cancelled (the first at once, then each after
    :func:`heartbeat_wait_s`); no error ends the loop.

    Args:
        http: client to send with.
        control_url: control-plane base URL.
        node_key: the node's heartbeat token.
        get_state: coroutine function building the state report.
        interval_s: seconds between heartbeats (`QUIVER_HEARTBEAT_SECONDS`).
        on_answer: called with each accepted heartbeat's answer (``send_heartbeat``'s return).
        draw: uniform draws in [0, 1) for the jitter (tests pass their own).
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
        await asyncio.sleep(heartbeat_wait_s(interval_s, draw()))
