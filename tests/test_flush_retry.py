"""The transactional tests' flush is retried after a deadlock, and only then."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError
from django.db import OperationalError

from tests.fixtures import flush_retry


def _failing(errors: list[BaseException]) -> Any:
    calls: list[int] = []

    def teardown(self: object) -> None:
        calls.append(1)
        if errors:
            raise errors.pop(0)

    return teardown, calls


def _flush_error(message: str) -> CommandError:
    try:
        raise CommandError("Database test_quiver couldn't be flushed.") from OperationalError(message)
    except CommandError as exc:
        return exc


def test_a_deadlocked_flush_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    teardown, calls = _failing([_flush_error("deadlock detected\nDETAIL: Process 1 waits for ...")])
    monkeypatch.setattr(flush_retry, "_teardown", teardown)
    monkeypatch.setattr(flush_retry.time, "sleep", lambda s: None)
    flush_retry._fixture_teardown_retrying(object())
    assert len(calls) == 2


def test_other_flush_errors_and_a_persistent_deadlock_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flush_retry.time, "sleep", lambda s: None)
    teardown, calls = _failing([_flush_error("relation does not exist")])
    monkeypatch.setattr(flush_retry, "_teardown", teardown)
    with pytest.raises(CommandError):
        flush_retry._fixture_teardown_retrying(object())
    assert len(calls) == 1
    teardown, calls = _failing([_flush_error("deadlock detected") for _ in range(flush_retry.ATTEMPTS)])
    monkeypatch.setattr(flush_retry, "_teardown", teardown)
    with pytest.raises(CommandError):
        flush_retry._fixture_teardown_retrying(object())
    assert len(calls) == flush_retry.ATTEMPTS
