"""What one node's state report (its heartbeat) changes on that node's placement rows, as pure functions.

The internal listener (``inference.fleet.nodes.node_heartbeat``) reads a snapshot: the report's adapters, the node's
placement rows with their operators' pins, and which reported versions exist under their own name and serve the
node's base model; it writes what ``report_changes`` returns. Nothing here reads the database or the clock.

Change-only heartbeats: ``report_digest`` sums up what ``report_changes`` reads of a report and of the rows. Once an
accept left the rows settled (``ReportChanges.settled``: the same report on the rows it left would change nothing),
the listener stores the digest of that report and those rows; a later heartbeat whose report and rows give the same
digest would write nothing, so the listener skips the version lookup and this decision. The digest covers the rows'
fields, not their ``updated_at``: any other writer's change to a row (a warm, an evict, a pin's mark, a deleted
version's rows) or to a pin changes it, without comparing clocks across processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from inference.policy.tiers import DB_WORD, IN_ENGINE, Tier

# Placement.Tier words (inference.fleet.models), from the one table of them (this package imports no app).
COLD = DB_WORD[Tier.COLD]
STAGED = DB_WORD[Tier.DISK]
RESIDENT = frozenset(DB_WORD[t] for t in IN_ENGINE)  # in the engine (its CPU cache or a GPU slot)
DROPPABLE = RESIDENT | {STAGED}  # what drops to cold when the node stops reporting it
DIGEST_FORMAT = "node-report-1"  # changing what the digest covers changes this, so stored digests stop matching


@dataclass(frozen=True)
class ReportedAdapter:
    """One adapter the node reports: engine id and name, tier, and whether it is pinned / served by name
    (``served`` None: not said, which means served when resident)."""

    lora_name: str
    lora_int_id: int
    tier: str
    pinned: bool
    served: bool | None


@dataclass(frozen=True)
class PlacementRow:
    """One placement row of the node as read, with its version's operator pins.

    ``pinned_fleet``: the version's intent pins it on every node holding it; ``pinned_here``: the intent names this
    node. Times are the database's values (timezone-aware); ``updated_at`` matters only to ``report_changes``.
    """

    pk: int
    version_id: int
    tier: str
    pinned: bool
    served: bool
    warming_since: datetime | None
    load_issued_at: datetime | None
    updated_at: datetime | None
    pinned_fleet: bool = False
    pinned_here: bool = False


@dataclass(frozen=True)
class ReportChanges:
    """What to write for one report.

    ``updates``: row pk → the fields to set (``tier``, ``pinned``, ``served`` and, unless a warm in flight keeps its
    mark, ``warming_since`` None), stamped with the accept's time by the caller. ``to_cold`` / ``to_cold_keep_pin``:
    rows the node stopped reporting, which drop to cold and unserved, losing their pin mark or (a pin naming the
    node) keeping it. ``orphans``: reported names no version owns (garbage on the node). ``unasked``: reported
    versions of this node's base model it was never asked to load (ignored). ``rows_after``: the rows as these
    writes leave them. ``settled``: no row was written since the previous heartbeat and every reported name is its
    version's own, so the same report on ``rows_after`` would change nothing: its digest may be stored. (An unasked
    version does not unsettle: what would make it count, a row or a ``load_issued_at`` mark, shows in the digest.)
    """

    updates: dict[int, dict[str, Any]]
    to_cold: tuple[int, ...]
    to_cold_keep_pin: tuple[int, ...]
    orphans: tuple[str, ...]
    unasked: tuple[int, ...]
    rows_after: tuple[PlacementRow, ...]
    settled: bool


def may_predate(row: PlacementRow, tier: str, previous: datetime | None) -> bool:
    """Whether a report of ``tier`` for ``row``, a row written since the node's previous heartbeat (recorded at
    ``previous``), may describe the node before that write: any word but resident may predate a load, and resident
    may predate an evict unless a load is in flight or was issued since ``previous`` (the node may answer a load's
    copy in a report sent before the load call returns)."""
    if tier not in RESIDENT:
        return True
    loading = row.warming_since is not None or (
        previous is not None and row.load_issued_at is not None and row.load_issued_at > previous)
    return row.tier not in RESIDENT and not loading


def report_changes(*, reported: Sequence[ReportedAdapter], owned: Collection[int], ours: Collection[int],
                   rows: Sequence[PlacementRow], previous: datetime | None) -> ReportChanges:
    """Decide what one validated report changes on its node's placement rows.

    Args:
        reported: the report's adapters (ids unique, as ``inference.fleet.heartbeat.heartbeat_parse`` checks).
        owned: reported version ids that exist and whose served name is the one reported.
        ours: those of ``owned`` that serve the node's base model.
        rows: every placement row of the node.
        previous: when the node's previous heartbeat was recorded (None: never).

    Returns:
        The changes. Only rows the control plane asked to load (``load_issued_at`` set) take a reported version's
        tier; a row written since ``previous`` takes from this report, which may predate the write, only that a
        load it asked for is resident (``may_predate``). The pinned mark is an operator's: the engine's report of a
        pin marks the row only where an operator's pin covers it (``pinned_fleet``/``pinned_here``), a mark stays
        while one does or the row was written since ``previous``, and a node's word alone never sets it (a host
        with a stolen node credential marked rows pinned, which the reconciler never trims; attack round). A warm in
        flight keeps its mark until the version is reported resident. Rows the node no longer reports (and not
        written since ``previous``, nor warming) drop from resident or staged to cold; a pin naming the node keeps
        its mark there (the report may predate the pinned load; the reconciler reloads a named pin that really went).
    """
    by_id = {entry.lora_int_id: entry for entry in reported}
    newer = {row.version_id for row in rows if previous is not None and row.updated_at is not None
             and row.updated_at > previous}
    current = {row.version_id: row for row in rows if row.version_id in ours and row.load_issued_at is not None}
    known = set(current)
    updates: dict[int, dict[str, Any]] = {}
    after: dict[int, PlacementRow] = {row.pk: row for row in rows}
    for version_id, row in current.items():
        entry = by_id[version_id]
        tier = entry.tier
        if version_id in newer and may_predate(row, tier, previous):
            continue
        intended = row.pinned_fleet or row.pinned_here
        pinned = ((entry.pinned or row.pinned) and intended) or (row.pinned and version_id in newer)
        served = entry.served if entry.served is not None else tier in RESIDENT
        wanted: dict[str, Any] = {"tier": tier, "pinned": pinned, "served": served, "warming_since": None}
        if row.warming_since is not None and tier not in RESIDENT:
            # A warm in flight keeps its mark until the node reports the version resident or the warm task records
            # its outcome: cleared here, the row's previous failure would answer the waiting request.
            del wanted["warming_since"]
        if any(getattr(row, field) != value for field, value in wanted.items()):
            updates[row.pk] = wanted
            after[row.pk] = replace(row, **wanted)
    to_cold: list[int] = []
    keep_pin: list[int] = []
    for row in rows:
        if row.tier in DROPPABLE and row.warming_since is None and row.version_id not in known | newer:
            (keep_pin if row.pinned_here else to_cold).append(row.pk)
            after[row.pk] = replace(row, tier=COLD, served=False, pinned=row.pinned and row.pinned_here)
    return ReportChanges(
        updates=updates, to_cold=tuple(to_cold), to_cold_keep_pin=tuple(keep_pin),
        orphans=tuple(entry.lora_name for entry in reported if entry.lora_int_id not in owned),
        unasked=tuple(sorted(set(ours) - known)),
        rows_after=tuple(after[row.pk] for row in rows),
        settled=not newer and all(entry.lora_int_id in owned for entry in reported))


def report_digest(reported: Sequence[ReportedAdapter], rows: Sequence[PlacementRow],
                  unplaced: Collection[int] = ()) -> str:
    """A hex sha256 of what ``report_changes`` reads of ``reported`` and ``rows``, in any order of either.

    Covers each reported adapter's id, name, tier, pinned and served, and each row's pk, version, tier, pinned,
    served, ``warming_since``, ``load_issued_at`` and operator pins; not ``updated_at`` (see the module's docstring).
    ``unplaced``: the reported versions that exist but have no row on the node. A row goes with its version, so
    the rows show a placed version's deletion; these ids show an unplaced one's (a name to purge from the node).
    """
    digest = hashlib.sha256(DIGEST_FORMAT.encode())
    digest.update(("\nu" + ",".join(str(v) for v in sorted(unplaced))).encode())
    for e in sorted(reported, key=lambda e: e.lora_int_id):
        digest.update(f"\na{e.lora_int_id}\t{e.lora_name}\t{e.tier}\t{e.pinned:d}\t{e.served}".encode())
    for r in sorted(rows, key=lambda r: r.pk):
        digest.update(f"\nr{r.pk}\t{r.version_id}\t{r.tier}\t{r.pinned:d}\t{r.served:d}\t{_iso(r.warming_since)}\t"
                      f"{_iso(r.load_issued_at)}\t{r.pinned_fleet:d}\t{r.pinned_here:d}".encode())
    return digest.hexdigest()


def _iso(value: datetime | None) -> str:
    return "" if value is None else value.isoformat()
