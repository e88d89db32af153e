"""Backoff for the reconciler's warms of one version on one node: pure, clock passed in.

The reconcile pass (every 30 s) asks for a warm wherever its plan wants a version loaded and the node's engine does
not hold it. A version whose load keeps failing, or that the engine keeps dropping again (its CPU cache's LRU, an
in-engine reload undoing it), was asked for on every pass, forever. Each (version, node) now waits
``base_s × 2^(failures − 1)`` after its last ask, at most ``cap_s`` (30 s → 1, 2, 4, 8 min → 15 min), where
``failures`` counts the asks since the pair was last seen settled. A pair counts as settled (and starts over) once
the engine has held it for twice the current delay after the last ask: a load that the engine undoes between two
passes keeps its backoff instead of resetting it every other pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WarmBackoffConfig:
    """``base_s``: the wait after the first ask (one reconcile period); ``cap_s``: the longest wait; ``early_s``: how
    much earlier than its delay a pair is already due, so a pass that starts a little less than a period after the
    last ask's pass does not skip a turn."""

    base_s: float = 30.0
    cap_s: float = 900.0
    early_s: float = 3.0


@dataclass(frozen=True)
class WarmBackoff:
    """One (version, node) pair's state: ``failures`` asks since it was last settled, the last at ``asked_at`` (s)."""

    failures: int
    asked_at: float


def warm_backoff_delay(failures: int, config: WarmBackoffConfig) -> float:
    """Seconds to wait after the ``failures``-th ask before the next: ``base_s × 2^(failures − 1)``, at most
    ``cap_s``; 0 before any ask."""
    if failures <= 0:
        return 0.0
    return min(config.cap_s, config.base_s * 2.0 ** min(failures - 1, 32))


def warm_backoff_due(state: WarmBackoff | None, *, now: float, config: WarmBackoffConfig) -> bool:
    """Whether a warm of the pair may be asked for at ``now``: never asked, or its delay (less ``early_s``) passed."""
    if state is None:
        return True
    return now - state.asked_at >= warm_backoff_delay(state.failures, config) - config.early_s


def warm_backoff_asked(state: WarmBackoff | None, *, now: float) -> WarmBackoff:
    """The pair's state after a warm was enqueued at ``now`` (one more failure until it is seen settled)."""
    return WarmBackoff(failures=(state.failures if state else 0) + 1, asked_at=now)


def warm_backoff_loaded(state: WarmBackoff | None, *, now: float, config: WarmBackoffConfig) -> WarmBackoff | None:
    """The pair's state on a pass that finds the engine holding it as wanted: None (reset) once it has held for twice
    the current delay after the last ask, else unchanged (an engine that drops it again keeps the backoff)."""
    if state is None or now - state.asked_at >= 2 * warm_backoff_delay(state.failures, config) - config.early_s:
        return None
    return state
