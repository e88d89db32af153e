"""HTTP client for node agents (``inference.node.agent``), authenticated with each node's own key.

The agent's contract: ``POST /v1/adapters/load|unload|pin``, ``GET /v1/state``; errors are ``{"detail", "code"}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from inference.fleet.node_keys import node_credentials

if TYPE_CHECKING:
    from inference.fleet.models import Node

LOAD_TIMEOUT_S = 120.0


class NodeCallFailed(Exception):
    """The agent refused or could not be reached. ``code`` is the agent's code or ``node_unreachable``."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def node_key(node: Node) -> str:
    """The bearer key the control plane presents to ``node``'s agent and engine (derived; see ``node_keys``)."""
    return node_credentials(node.name, node.key_generation).key


def node_call(node: Node, path: str, payload: dict[str, Any], *, timeout: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
    """POST ``payload`` to the registered agent URL of ``node`` + ``path`` with the node's key; return the JSON.

    Raises:
        NodeCallFailed: a non-2xx answer (with the agent's code) or a transport error.
    """
    headers = {"Authorization": f"Bearer {node_key(node)}"}
    try:
        resp = httpx.post(node.agent_url.rstrip("/") + path, json=payload, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise NodeCallFailed("node_unreachable", str(exc)) from exc
    if resp.status_code >= 300:
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text[:500], "code": f"http_{resp.status_code}"}
        raise NodeCallFailed(str(body.get("code", f"http_{resp.status_code}")), str(body.get("detail", "")))
    return resp.json()
