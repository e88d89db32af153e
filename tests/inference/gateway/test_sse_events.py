"""The one parser of the engine's server-sent events (``answers.sse_event``) and of its mid-stream errors
(``answers.engine_error_code``), as the relay, the JSON assembly and the billing of cut streams read them."""

from __future__ import annotations

import pytest

from inference.gateway.answers import DONE, UsageTally, engine_error_code, sse_event
from inference.gateway.relay import _tally_line


@pytest.mark.parametrize(("line", "expected"), [
    ('data: {"choices": []}', {"choices": []}),
    ('data:{"a":1}', {"a": 1}),  # the space after the colon is optional (WHATWG SSE)
    ("data: [DONE]", DONE),
    ("", None), (": keep-alive", None), ("event: x", None), ("data: [1, 2]", None), ('data: "text"', None),
    ('data: {"cut', None),  # the tail of a half-read line
])
def test_each_line_is_an_event_the_end_or_nothing(line: str, expected: object) -> None:
    assert sse_event(line) == expected


@pytest.mark.parametrize(("event", "code"), [
    ({"error": {"message": "boom", "code": 500}}, 500),
    ({"error": {"message": "bad", "code": 400}}, 400),
    ({"error": {"message": "odd", "code": 200}}, 500),  # not an error status: a server error
    ({"error": {"message": "odd", "code": True}}, 500),
    ({"error": {"message": "odd"}}, 500),
    ({"error": {"code": 500}, "choices": [{"index": 0}]}, None),  # choices: still an answer
    ({"error": "text"}, None),
    ({"choices": [{"index": 0}]}, None),
])
def test_an_engine_error_event_has_an_http_error_status(event: dict[str, object], code: int | None) -> None:
    assert engine_error_code(event) == code


def test_cut_lines_are_billed_without_errors_or_half_lines() -> None:
    tally = UsageTally(n=2)
    for line in ['data: {"choices": [{"index": 0}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}',
                 'data: {"choices": [{"index": 1}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}',
                 'data: {"error": {"code": 500}, "usage": {"prompt_tokens": 3, "completion_tokens": 90}}',
                 'data: {"choices": [{"index": 1}], "usa']:
        _tally_line(line, tally)
    assert tally.usage() == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}
