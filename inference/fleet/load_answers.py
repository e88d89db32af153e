"""A node agent's answer to ``POST /v1/adapters/load``, checked before anything of it is stored.

The answer is the node's word: a host holding a stolen node key answers as that node, and an attack round stored
``tier = "bogus"``, a ``load_ms`` of ``-1e308``, and failed the warm task with a ``ValueError`` on a ``load_ms`` of
``"soon"`` (issue 30). Each figure is kept only when it is one an agent can give (``inference.node.service.
AgentService.load``); anything else is replaced by a safe value and logged once per answer
(``placement.load_answer_clamped``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from inference.fleet.models import RESIDENT, Placement
from inference.fleet.node_client import LOAD_TIMEOUT_S

logger = logging.getLogger(__name__)

# The agent answers once its engine holds the adapter, within the load call's timeout: a longer load cannot be
# measured by an agent that answered, so a bigger figure is made up.
LOAD_MS_MAX = LOAD_TIMEOUT_S * 1000.0
EFFECTS = ("changed", "no_effect", "unknown")


@dataclass(frozen=True)
class LoadAnswer:
    """The figures of one load answer that the control plane stores.

    Attributes:
        tier: ``hot`` or ``warm`` (the engine holds it; ``warm`` when the answer named anything else).
        load_ms: the engine's load time in milliseconds, finite, 0 to ``LOAD_MS_MAX``; None when not given or bad.
        effect: the effect probe's verdict, one of ``EFFECTS``, or ``""`` when not given or bad.
        pinned: the answer's ``pinned`` when it is a boolean, else None (the caller keeps the pin it asked for).
    """

    tier: str
    load_ms: float | None
    effect: str
    pinned: bool | None


def load_answer_checked(answer: Any, *, node: str, version_id: int) -> LoadAnswer:
    """Check a load answer's figures (``answer``: the agent's JSON, any shape) for node ``node`` and version
    ``version_id`` (both for the log only).

    Never raises: a bad figure is replaced (``tier`` → ``warm``, ``load_ms`` → None, ``effect`` → ``""``, ``pinned``
    → None) and the replaced fields are logged in one ``placement.load_answer_clamped`` warning.
    """
    body = answer if isinstance(answer, dict) else {}
    bad: list[str] = [] if isinstance(answer, dict) else ["answer"]
    tier = body.get("tier", Placement.Tier.WARM)
    if tier not in RESIDENT:
        bad.append("tier")
        tier = Placement.Tier.WARM
    load_ms = body.get("load_ms")
    if load_ms is not None and not _load_ms_ok(load_ms):
        bad.append("load_ms")
        load_ms = None
    effect = body.get("effect", "")
    if effect != "" and effect not in EFFECTS:
        bad.append("effect")
        effect = ""
    pinned = body.get("pinned")
    if pinned is not None and not isinstance(pinned, bool):
        bad.append("pinned")
        pinned = None
    if bad:
        logger.warning("placement.load_answer_clamped",
                       extra={"node": node, "version_id": version_id, "fields": bad,
                              "answer": repr(answer)[:200]})
    return LoadAnswer(tier=str(tier), load_ms=float(load_ms) if load_ms is not None else None, effect=str(effect),
                      pinned=pinned)


def _load_ms_ok(value: Any) -> bool:
    """A JSON number (not a boolean), finite, 0 to ``LOAD_MS_MAX``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # One comparison covers NaN (never in range), the infinities and an integer too large for a float.
    return 0.0 <= value <= LOAD_MS_MAX
