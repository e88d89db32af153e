"""What a node's report changes on its placement rows (``inference.policy.node_report``), without a database: a
settled accept leaves rows on which the same report changes nothing (what lets the listener skip it), and the digest
moves with every input of the decision but the rows' timestamps."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from inference.policy.node_report import PlacementRow, ReportedAdapter, report_changes, report_digest

T0 = datetime(2026, 12, 1, tzinfo=UTC)
TIERS = ["cold", "staged", "warm", "hot", "errored"]


def _row(pk: int, tier: str = "warm", **fields: object) -> PlacementRow:
    base = {"pk": pk, "version_id": pk, "tier": tier, "pinned": False, "served": tier in ("warm", "hot"),
            "warming_since": None, "load_issued_at": T0, "updated_at": T0}
    return PlacementRow(**{**base, **fields})  # type: ignore[arg-type]


def _entry(version_id: int, tier: str = "warm", **fields: object) -> ReportedAdapter:
    base = {"lora_name": f"t--a{version_id}--{version_id}", "lora_int_id": version_id, "tier": tier,
            "pinned": False, "served": None}
    return ReportedAdapter(**{**base, **fields})  # type: ignore[arg-type]


def _random_case(rng: random.Random) -> tuple[list[ReportedAdapter], list[PlacementRow], set[int], datetime]:
    previous = T0 + timedelta(seconds=10)
    later = previous + timedelta(seconds=1)
    rows = [_row(pk, rng.choice(TIERS), pinned=rng.random() < 0.3, served=rng.random() < 0.5,
                 warming_since=rng.choice([None, None, T0]),
                 load_issued_at=rng.choice([T0] * 8 + [None, later]),
                 updated_at=later if rng.random() < 0.1 else T0,
                 pinned_fleet=rng.random() < 0.2, pinned_here=rng.random() < 0.2)
            for pk in range(1, rng.randint(2, 12))]
    ids = [r.version_id for r in rows if rng.random() < 0.6] + ([99] if rng.random() < 0.1 else [])
    reported = [_entry(v, rng.choice(["staged", "warm", "hot", "errored"]), pinned=rng.random() < 0.3,
                       served=rng.choice([None, True, False])) for v in ids]
    ours = {v for v in ids if rng.random() < 0.95}
    return reported, rows, ours, previous


def test_a_settled_report_changes_nothing_on_the_rows_it_left() -> None:
    """The property the listener's skip rests on, over random snapshots: once ``settled``, the same report on
    ``rows_after`` (at a later heartbeat, the rows stamped by this one) writes nothing and settles again."""
    rng = random.Random(1)
    settled = 0
    for _ in range(3000):
        reported, rows, ours, previous = _random_case(rng)
        first = report_changes(reported=reported, owned=ours, ours=ours, rows=rows, previous=previous)
        if not first.settled:
            continue
        settled += 1
        now = previous + timedelta(seconds=5)
        stamped = [replace(r, updated_at=now) if r.pk in first.updates else r for r in first.rows_after]
        again = report_changes(reported=reported, owned=ours, ours=ours, rows=stamped, previous=now)
        assert (again.updates, again.to_cold, again.to_cold_keep_pin) == ({}, (), ()), (reported, rows)
        assert again.settled and again.rows_after == tuple(stamped)
        assert report_digest(reported, stamped) == report_digest(reported, first.rows_after)
    assert settled > 300  # the property was exercised, not vacuous


def test_a_row_written_since_the_previous_heartbeat_is_not_undone_and_not_settled() -> None:
    """An evict landed after the previous heartbeat (row staged, written later); the report still says warm and may
    predate the evict: the row is left, and the accept does not settle, so the next report decides again."""
    previous = T0 + timedelta(seconds=10)
    row = _row(1, "staged", served=False, updated_at=previous + timedelta(seconds=1))
    changes = report_changes(reported=[_entry(1, "warm")], owned={1}, ours={1}, rows=[row], previous=previous)
    assert changes.updates == {} and not changes.settled


def test_rows_the_node_no_longer_reports_drop_to_cold_and_a_named_pin_keeps_its_mark() -> None:
    rows = [_row(1, "hot", pinned=True, pinned_here=True), _row(2, "warm", pinned=True, pinned_fleet=True),
            _row(3, "staged"), _row(4, "warm", warming_since=T0), _row(5, "cold")]
    changes = report_changes(reported=[], owned=set(), ours=set(), rows=rows, previous=T0)
    assert (changes.to_cold, changes.to_cold_keep_pin) == ((2, 3), (1,))
    after = {r.pk: (r.tier, r.pinned, r.served) for r in changes.rows_after}
    assert after == {1: ("cold", True, False), 2: ("cold", False, False), 3: ("cold", False, False),
                     4: ("warm", False, True), 5: ("cold", False, False)}
    assert changes.settled


def test_an_unowned_name_keeps_it_unsettled_and_an_unasked_version_does_not() -> None:
    """A name no version owns is purged a few at a time, report after report, so its report must be decided again;
    an unasked version changes nothing until a row or a mark appears for it, which the digest shows."""
    reported = [_entry(1), _entry(2), _entry(3)]
    changes = report_changes(reported=reported, owned={1, 2}, ours={1, 2}, rows=[_row(1)], previous=T0)
    assert changes.orphans == ("t--a3--3",) and changes.unasked == (2,) and not changes.settled
    changes = report_changes(reported=reported[:2], owned={1, 2}, ours={1, 2}, rows=[_row(1)], previous=T0)
    assert changes.unasked == (2,) and changes.settled


@pytest.mark.parametrize("change", [
    lambda rep, rows: ([replace(rep[0], tier="hot")], rows),
    lambda rep, rows: ([replace(rep[0], pinned=True)], rows),
    lambda rep, rows: ([replace(rep[0], served=False)], rows),
    lambda rep, rows: ([replace(rep[0], lora_name="other--name--1")], rows),
    lambda rep, rows: ([], rows),
    lambda rep, rows: (rep, [replace(rows[0], tier="staged")]),
    lambda rep, rows: (rep, [replace(rows[0], pinned=True)]),
    lambda rep, rows: (rep, [replace(rows[0], served=False)]),
    lambda rep, rows: (rep, [replace(rows[0], warming_since=T0)]),
    lambda rep, rows: (rep, [replace(rows[0], load_issued_at=None)]),
    lambda rep, rows: (rep, [replace(rows[0], pinned_fleet=True)]),
    lambda rep, rows: (rep, [replace(rows[0], pinned_here=True)]),
    lambda rep, rows: (rep, []),  # the version was deleted: its row went with it
])
def test_the_digest_moves_with_every_input_of_the_decision(change: object) -> None:
    reported, rows = [_entry(1)], [_row(1)]
    assert report_digest(*change(reported, rows)) != report_digest(reported, rows)  # type: ignore[operator]


def test_the_digest_moves_when_an_unplaced_version_is_deleted() -> None:
    reported, rows = [_entry(1), _entry(2, "staged")], [_row(1)]
    assert report_digest(reported, rows, {2}) != report_digest(reported, rows, set())


def test_the_digest_ignores_order_and_timestamps() -> None:
    reported, rows = [_entry(1), _entry(2, "hot")], [_row(1), _row(2, "hot")]
    later = [replace(r, updated_at=T0 + timedelta(hours=1)) for r in reversed(rows)]
    assert report_digest(list(reversed(reported)), later) == report_digest(reported, rows)


def test_a_nodes_word_alone_never_marks_a_row_pinned() -> None:
    """The pinned mark is an operator's: an engine reporting a pin marks the row only where the version's intent pins
    it there or fleet-wide; a host with a stolen node credential marked rows pinned, and pinned rows are never
    trimmed (attack round). An unpinned row stays unpinned; a stale mark no operator pin covers goes."""
    rows = [_row(1), _row(2, pinned_here=True), _row(3, pinned_fleet=True), _row(4, pinned=True)]
    reported = [_entry(v, "hot", pinned=True) for v in (1, 2, 3, 4)]
    changes = report_changes(reported=reported, owned={1, 2, 3, 4}, ours={1, 2, 3, 4}, rows=rows, previous=T0)
    assert {r.pk: r.pinned for r in changes.rows_after} == {1: False, 2: True, 3: True, 4: False}
