"""HTTP client for node agents (``inference.node.agent``), authenticated with the shared node key.

The agent's contract: ``POST /v1/adapters/load|unload|pin``, ``GET /v1/state``; errors are ``{"detail", "code"}``.
"""

from __future__ import annotations

from typing import Any

import httpx
from django.conf import settings

LOAD_TIMEOUT_S = 120.0


class NodeCallFailed(Exception):
    """The agent refused or could not be reached. ``code`` is the agent's code or ``node_unreachable``."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def node_call(agent_url: str, path: str, payload: dict[str, Any], *, timeout: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
    """POST ``payload`` to ``agent_url + path`` and return the JSON answer.

    Raises:
        NodeCallFailed: a non-2xx answer (with the agent's code) or a transport error.
    """
    headers = {"Authorization": f"Bearer {settings.QUIVER_NODE_KEY}"}
    try:
        resp = httpx.post(agent_url.rstrip("/") + path, json=payload, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise NodeCallFailed("node_unreachable", str(exc)) from exc
    if resp.status_code >= 300:
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text[:500], "code": f"http_{resp.status_code}"}
        raise NodeCallFailed(str(body.get("code", f"http_{resp.status_code}")), str(body.get("detail", "")))
    return resp.json()
