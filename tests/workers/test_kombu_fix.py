"""The Celery 5.7.0 close-path guard: a restore that hits a transport without a client is skipped, not fatal."""

from __future__ import annotations

import logging
import os
from queue import Empty
from types import SimpleNamespace

import pytest
from kombu.transport import filesystem as kombu_filesystem
from kombu.transport import redis as kombu_redis

from workers import kombu_fix


def _qos_without_client() -> kombu_redis.QoS:
    """A QoS whose channel sits on a closed transport (``client`` is None), as in the crash."""
    qos = kombu_redis.QoS.__new__(kombu_redis.QoS)
    channel = kombu_redis.Channel.__new__(kombu_redis.Channel)
    channel.connection = SimpleNamespace(client=None)  # type: ignore[assignment]
    channel._pool = None
    qos.channel = channel
    qos._delivered = {"tag-1": object()}  # type: ignore[assignment]
    qos._dirty = set()  # type: ignore[assignment]
    qos._quick_ack = qos._dirty.add  # type: ignore[attr-defined]
    return qos


def test_unguarded_restore_raises_the_crash_error() -> None:
    with pytest.raises(AttributeError, match="hostname"):
        kombu_fix._restore_unacked(_qos_without_client())


def test_installed_guard_skips_the_restore_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    kombu_fix.install()
    kombu_fix.install()  # idempotent: never wraps itself
    assert kombu_redis.QoS.restore_unacked is kombu_fix._restore_unacked_or_leave
    with caplog.at_level(logging.WARNING, logger="workers.kombu_fix"):
        assert kombu_redis.QoS.restore_unacked(_qos_without_client()) is None
    assert [r.getMessage() for r in caplog.records] == ["celery.restore_unacked_skipped"]


def test_unguarded_ack_on_a_closed_channel_raises_the_crash_error() -> None:
    qos = _qos_without_client()
    qos.channel.connection = None  # type: ignore[assignment]
    with pytest.raises(AttributeError, match="client"):
        kombu_fix._ack(qos, "tag-1")


@pytest.mark.parametrize("settle", ["ack", "reject"])
def test_installed_guard_forgets_a_late_ack_on_a_closed_channel(settle: str, caplog: pytest.LogCaptureFixture) -> None:
    kombu_fix.install()
    kombu_fix.install()
    qos = _qos_without_client()
    qos.channel.connection = None  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="workers.kombu_fix"):
        assert getattr(kombu_redis.QoS, settle)(qos, "tag-1") is None
    assert qos._dirty == {"tag-1"}  # forgotten locally: kombu drops dirty tags from _delivered lazily
    assert [r.getMessage() for r in caplog.records] == [f"celery.{settle}_on_closed_channel_skipped"]


def test_guard_reraises_an_attribute_error_on_an_open_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object, delivery_tag: object) -> None:
        raise AttributeError("a real bug")

    qos = _qos_without_client()
    qos.channel.connection = SimpleNamespace(client=object())  # type: ignore[assignment]
    with pytest.raises(AttributeError, match="a real bug"):
        kombu_fix._settle_or_forget(broken, "x")(qos, "tag-1")


def _fs_channel(folder) -> kombu_filesystem.Channel:  # type: ignore[no-untyped-def]
    """A filesystem-transport channel over ``folder`` as the demo configures it (in and out the same folder)."""
    channel = kombu_filesystem.Channel.__new__(kombu_filesystem.Channel)
    channel.data_folder_in = channel.data_folder_out = str(folder)
    channel.store_processed = False
    channel.processed_folder = str(folder)
    return channel


def test_unguarded_filesystem_put_lets_a_consumer_take_an_empty_message(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The crash: kombu creates the file, then locks and writes it; a consumer listing the folder in between takes
    an empty file, and ``loads`` fails (the worker's "Unrecoverable error")."""
    channel = _fs_channel(tmp_path)
    taken: list[BaseException] = []
    real_lock = kombu_filesystem.lock

    def lock_then_consumer_runs(handle, flags):  # type: ignore[no-untyped-def]
        try:
            kombu_filesystem.Channel._get(channel, "celery")
        except Exception as exc:  # noqa: BLE001 - the failure is what is asserted
            taken.append(exc)
        return real_lock(handle, flags)

    monkeypatch.setattr(kombu_filesystem, "lock", lock_then_consumer_runs)
    kombu_fix._put_original(channel, "celery", {"body": "x"})
    assert taken and isinstance(taken[0], ValueError)  # json.JSONDecodeError


def test_guarded_filesystem_put_is_invisible_until_whole(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    kombu_fix.install()
    assert kombu_filesystem.Channel._put is kombu_fix._put_whole
    channel = _fs_channel(tmp_path)
    seen: list[object] = []
    real_replace = os.replace

    def consumer_runs_before_the_rename(src, dst):  # type: ignore[no-untyped-def]
        with pytest.raises(Empty):  # the written-but-unrenamed file is not a message yet
            kombu_filesystem.Channel._get(channel, "celery")
        seen.append(src)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", consumer_runs_before_the_rename)
    channel._put("celery", {"body": "x"})
    assert len(seen) == 1
    assert kombu_filesystem.Channel._get(channel, "celery") == {"body": "x"}
    assert list(tmp_path.iterdir()) == []  # taken, and no temp file left
