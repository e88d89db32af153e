"""The gateway's database thread never keeps a connection left inside a transaction."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from inference.gateway.directory import db_call


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _leave_a_transaction_open() -> int:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("SELECT count(*) FROM django_migrations")  # takes an AccessShareLock until the end
    return _backend_pid()


@pytest.mark.django_db(transaction=True)
def test_a_connection_left_in_a_transaction_is_closed_at_once() -> None:
    call = async_to_sync(db_call)
    inside = call(_leave_a_transaction_open)
    assert connection.connection is None  # closed: its locks and snapshot are gone
    after = call(_backend_pid)
    assert after != inside
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [inside])
        assert cursor.fetchone()[0] == 0 or _gone_soon(inside)


def _gone_soon(pid: int) -> bool:
    import time

    for _ in range(50):
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid])
            row = cursor.fetchone()
        if row is None:
            return True
        time.sleep(0.1)
    return False
