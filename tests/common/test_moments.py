"""``common.moments``: a span back from now, or None for the caller to try ISO 8601."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from common.moments import parse_moment

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("value", "back"), [("15m", timedelta(minutes=15)), ("1h", timedelta(hours=1)),
                                             ("24h", timedelta(hours=24)), ("7d", timedelta(days=7)),
                                             (" 2w ", timedelta(weeks=2)), ("0m", timedelta(0))])
def test_a_span_counts_back_from_now(value: str, back: timedelta) -> None:
    assert parse_moment(value, now=NOW) == NOW - back


@pytest.mark.parametrize("value", ["2026-03-01T00:00:00Z", "1y", "-1h", "1.5h", "h", "1 h", "1H", ""])
def test_anything_else_is_not_a_span(value: str) -> None:
    assert parse_moment(value, now=NOW) is None


def test_a_span_past_the_year_1_is_a_value_error_not_an_overflow() -> None:
    with pytest.raises(ValueError, match="before the year 1"):
        parse_moment("999999999w", now=NOW)
