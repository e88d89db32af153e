"""Moments in API queries: ISO 8601, or a span back from now (``15m``, ``1h``, ``24h``, ``7d``, ``2w``).

One parser for every ``since``/``until`` the control-plane API takes, so ``?since=1h`` means the same everywhere and a
wrong value gets the same 400 naming the field and both accepted forms. ``MomentField`` is the DRF field over it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

_SPAN = re.compile(r"^(\d{1,9})([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: What an error tells the caller to send instead.
ACCEPTED = ("ISO 8601 (2025-01-31T00:00:00Z) or a span back from now: a whole number and m, h, d or w "
            "(15m, 1h, 24h, 7d, 2w)")


def parse_moment(value: str, *, now: datetime) -> datetime | None:
    """The moment ``value`` names, or None when it is not a span (the caller then tries ISO 8601).

    Args:
        value: ``<N><unit>`` with unit ``m`` (minutes), ``h`` (hours), ``d`` (days) or ``w`` (weeks), surrounding
            whitespace ignored; anything else returns None.
        now: the moment spans count back from (timezone-aware).

    Returns:
        ``now`` minus the span (aware, in ``now``'s zone), or None.

    Raises:
        ValueError: the span reaches past the year 1 (e.g. ``99999999w``).
    """
    match = _SPAN.match(value.strip())
    if not match:
        return None
    try:
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    except OverflowError as exc:  # timedelta or the subtraction leaves datetime's range: a 400, never a 500
        raise ValueError(f"{value.strip()!r} reaches back before the year 1.") from exc


@extend_schema_field({"type": "string", "description": f"{ACCEPTED}; a moment without a zone is UTC",
                      "example": "24h"})
class MomentField(serializers.DateTimeField):
    """A ``DateTimeField`` that also takes a span back from now (``parse_moment``); the value is an aware datetime.

    A malformed value is a validation error on the field (``{"fields": {"since": [...]}}`` in the envelope) that names
    both accepted forms, with the code ``invalid``.
    """

    default_error_messages = {
        "invalid": f"Give {ACCEPTED}.",
        "span": "{detail} Give " + ACCEPTED + ".",
    }

    def to_internal_value(self, value: Any) -> datetime:
        """Resolve a span against ``timezone.now()``; otherwise parse ISO 8601 as ``DateTimeField`` does (a naive
        moment is taken as UTC, the project's time zone)."""
        if isinstance(value, str):
            try:
                moment = parse_moment(value, now=timezone.now())
            except ValueError as exc:
                self.fail("span", detail=str(exc))
            if moment is not None:
                return moment.astimezone(UTC)
        result: datetime = super().to_internal_value(value)
        return result
