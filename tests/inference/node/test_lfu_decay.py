"""The agent's LFU counts decay (issue 6: "LFU with decay"): traffic that moved away stops holding a slot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inference.node.eviction import Evictor
from inference.policy.eviction import EvictionConfig, EvictionPolicy


def test_request_counts_halve_every_half_life_and_new_requests_count_in_full() -> None:
    agent = SimpleNamespace(_hits={}, config=EvictionConfig(policy=EvictionPolicy.LFU, half_life_s=100.0))
    first = Evictor.decayed_requests(agent, {1: 400.0, 2: 10.0}, 1000.0)  # type: ignore[arg-type]
    assert first == {1: 400.0, 2: 10.0}  # first sight: everything it has done so far
    later = Evictor.decayed_requests(agent, {1: 400.0, 2: 110.0}, 1200.0)  # type: ignore[arg-type]
    assert later[1] == pytest.approx(100.0)  # two half-lives idle: 400 → 100
    assert later[2] == pytest.approx(10.0 / 4 + 100.0)  # its 100 new requests count in full
    much_later = Evictor.decayed_requests(agent, {2: 110.0}, 1300.0)  # type: ignore[arg-type]
    assert set(much_later) == {2}  # 1 was removed from the engine: not a resident now
    back = Evictor.decayed_requests(agent, {1: 410.0, 2: 110.0}, 1400.0)  # type: ignore[arg-type]
    # Re-added: its all-time 410 requests would outrank 2 forever; it resumes from its decayed count instead.
    assert back[1] == pytest.approx(400.0 / 16 + 10.0)
    reset = Evictor.decayed_requests(agent, {2: 5.0}, 1600.0)  # type: ignore[arg-type]
    assert reset == {2: 5.0}  # the engine restarted (its total went down): start over


def test_records_of_removed_adapters_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("inference.node.eviction.HITS_KEPT", 3)
    agent = SimpleNamespace(_hits={}, config=EvictionConfig(policy=EvictionPolicy.LFU, half_life_s=100.0))
    for t, i in enumerate(range(1, 6)):
        Evictor.decayed_requests(agent, {i: 1.0}, float(t))  # type: ignore[arg-type]
    assert set(agent._hits) == {3, 4, 5}  # the longest unseen go first
