"""Log lines carry the event's extra fields (they said that something failed, not why)."""

from __future__ import annotations

import logging

from inference.logfmt import KeyValueFormatter


def _line(**extra: object) -> str:
    record = logging.getLogger("quiver.test").makeRecord("quiver.test", logging.WARNING, __file__, 1,
                                                          "agent.load_publish_failed", None, None, extra=extra)
    return KeyValueFormatter().format(record)


def test_extra_fields_follow_the_message_as_key_value_pairs() -> None:
    line = _line(error="ConnectionError('refused')", node="node-1", age_s=1.5)
    assert " WARNING quiver.test agent.load_publish_failed " in line
    assert line.endswith(" error=\"ConnectionError('refused')\" node=node-1 age_s=1.5")


def test_a_plain_event_has_no_trailing_fields_and_a_huge_value_is_cut() -> None:
    assert _line().endswith("agent.load_publish_failed")
    assert len(_line(body="x" * 10_000)) < 700
