"""Quoting a caller's input back in an error message without echoing all of it."""

from __future__ import annotations

# A value quoted in an error message is cut here: enough to recognise it, not the body cap's worth (an unknown
# 100 KB `base_model` was quoted back whole).
ECHO_MAX_CHARS = 100


def clip(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """``value`` as text for an error message: at most ``limit`` characters, then ``…`` when cut."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}…"
