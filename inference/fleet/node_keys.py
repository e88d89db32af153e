"""Per-node credentials, derived from the control plane's ``QUIVER_NODE_SECRET`` (nothing secret is stored).

Each registered node gets two values, printed once by ``manage.py quiver_node_register``:

- its **node key** (``QUIVER_NODE_KEY`` on the node; vLLM's ``VLLM_API_KEY``): what the control plane presents to
  that node's agent and engine, and what the agent presents to its own engine;
- its **heartbeat token** (``QUIVER_NODE_TOKEN``): what the agent presents to the control plane. It names the node,
  so a heartbeat's identity comes from its credential, never from its body.

Both are HMAC-SHA256 of ``(purpose, node name, key generation)`` under ``QUIVER_NODE_SECRET``, so one node's values
tell nothing about another's, a database dump reveals none, and re-registering with ``--rotate`` (generation + 1)
revokes a node's old pair. Keys for calls and for reports differ, so a party that sees the calls we send a node
cannot report as that node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from django.conf import settings

TOKEN_PREFIX = "qvn_"


@dataclass(frozen=True)
class NodeCredentials:
    """A node's pair of credentials.

    Attributes:
        name: the node's registered name.
        key: the node key (bearer token towards the node's agent and engine).
        token: the heartbeat token ``qvn_<name>.<secret>`` (bearer token towards the control plane).
    """

    name: str
    key: str
    token: str


def _derive(purpose: str, name: str, generation: int) -> str:
    message = f"quiver/{purpose}/{name}/{generation}".encode()
    mac = hmac.new(settings.QUIVER_NODE_SECRET.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def node_credentials(name: str, generation: int = 1) -> NodeCredentials:
    """The credentials of node ``name`` at key ``generation`` (pure; same inputs, same values)."""
    return NodeCredentials(name=name, key=_derive("call", name, generation),
                           token=f"{TOKEN_PREFIX}{name}.{_derive('report', name, generation)}")


def token_node_name(token: str) -> str | None:
    """The node name a heartbeat token claims (unverified), or None when it is not shaped like one."""
    if not token.startswith(TOKEN_PREFIX) or "." not in token:
        return None
    return token[len(TOKEN_PREFIX):].rpartition(".")[0] or None


def token_matches(token: str, name: str, generation: int) -> bool:
    """Whether ``token`` is node ``name``'s heartbeat token at ``generation`` (constant-time compare)."""
    return hmac.compare_digest(token.encode(), node_credentials(name, generation).token.encode())
