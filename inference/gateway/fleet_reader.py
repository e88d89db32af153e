"""A gateway process's fleet reads: the whole fleet at start and every ``FULL_EVERY_S``, otherwise only the node and
placement rows written or deleted since the last read.

Every gateway process refreshes its fleet view each ``QUIVER_GATEWAY_FLEET_REFRESH_S`` (0.5 s). Read whole, that was
every live node and every placement that serves or failed: 2,756 rows and 62 ms of CPU (p99) per read at 64 nodes ×
2,000 adapters (docs/scale.md), for a fleet in which a few rows move between two reads. A change read costs what
changed (``scripts/bench_fleet_view``).

**What marks a change: the writing transaction's id, not a timestamp.** A trigger stamps each node and placement row
on every INSERT and UPDATE with ``pg_current_xact_id()`` (``change_xid``, migration ``fleet.0003``), and records each
deleted row in ``FleetGone`` with the same stamp. A read first takes ``xmin`` of its own snapshot, the oldest
transaction still running (or, inside a transaction that has written, its own id if older), and the next read asks
for the rows stamped at or after it. Every transaction not yet committed when the snapshot was taken has an id at
or above that ``xmin`` (PostgreSQL's definition of a snapshot's ``xmin``), so a row that commits after a read, however
late and whatever its ``updated_at`` says, is read by the next one: nothing is missed, there is no safety margin to
guess, and no clock is compared across hosts. ``updated_at`` could not serve: ``QuerySet.update`` (most placement
writes: warms, evictions, heartbeats dropping rows to cold) does not set it, and its time is taken when the row is
written, not when it commits. A row is read again while a transaction older than its stamp is still running (a
long write transaction makes change reads re-read what changed since it began): harmless, rows apply idempotently.
A change read is one statement: its cursor, nodes, placements and deletions come from one snapshot.

**Rows leaving the view.** A placement that goes cold is an UPDATE: read, and dropped from the view. A node going
unhealthy is an UPDATE: read, and it and its placements leave the view; its rows are kept in the mirror so that they
come back when it does. A node whose heartbeats stop leaves when its last one is older than
``QUIVER_NODE_STALE_AFTER_S``, checked on every read as before. Deleted placements (a node deregistered or moved to
another base model, a version or adapter deleted) and deleted nodes arrive as ``FleetGone`` records.

**Full reads** still run at start, after ``reset`` (the bus's ``all`` message), after a failed read, and every
``FULL_EVERY_S``: a safety net for writes that bypass triggers (``session_replication_role = replica``, a restore),
never needed by the design. ``FleetGone`` records are kept ``GONE_KEEP_S`` (10 minutes), far above
``FULL_EVERY_S``. On SQLite (the embedded demo) there are no triggers: every read is full, as before.

**The copy.** :class:`FleetMirror` holds every node row and every placement row that serves or failed and turns them
into the frozen :class:`~inference.gateway.snapshot.FleetView` the request path reads. It does no I/O and reads no
clock (:class:`FleetReader` passes the rows, the liveness cut-off and the reconciler's plan), so tests drive it with
plain values. Its work per apply is proportional to what changed: the rows passed, the versions they touch and the
versions on nodes whose liveness flipped, plus one pass over the nodes (liveness is a matter of time, not of
writes) and one shallow copy of the version → placements dict (~20 µs for 2,000 versions). A view handed out is
never changed: each apply returns a new one sharing the unchanged tuples with the previous one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.utils import timezone as dj_timezone

from inference.fleet.models import FleetGone, Node, Placement
from inference.fleet.node_keys import node_credentials
from inference.fleet.plan import plan_all
from inference.gateway.snapshot import FleetView, NodeView, PlacementView

logger = logging.getLogger(__name__)
FULL_EVERY_S = 60.0  # well under GONE_KEEP_S: a change read never needs a FleetGone record already dropped

# Only the one figure of the stored heartbeat used here: the whole body (10,000 adapters, up to 4 MB) cost every
# process ~15 ms per node per read.
_NODE_SQL = ("SELECT id, name, key_generation, engine_url, base_model_id, max_lora_rank, max_loras, "
             "state -> 'residency' -> 'gpu', num_requests_running, num_requests_waiting, kv_cache_usage_perc, "
             f"healthy, last_heartbeat_at FROM {Node._meta.db_table} ")  # noqa: S608 (names, not input)
_PLACEMENT_SQL = ("SELECT id, node_id, adapter_version_id, tier, served, last_error, warming_since "
                  f"FROM {Placement._meta.db_table} ")  # noqa: S608 (names, not input)
# Where the next change read starts (see the module docstring). LEAST ignores the NULL of a transaction without an
# id of its own; ours has one only inside a caller's transaction that wrote (a test lending its connection).
_CURSOR_SQL = ("SELECT LEAST(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned())"
               "::text::bigint")
# A change read is one statement, so one snapshot and one round trip: the next cursor (kind 0), the node rows (1)
# and placement rows (2) stamped at or after this one, and the deletions recorded since (3), each row as a JSON
# array in the order of _NODE_SQL's and _PLACEMENT_SQL's columns (a UNION needs one shape; four statements were
# half of a change read's CPU).
_CHANGES_SQL = (
    "SELECT 0, json_build_array(LEAST(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned())"
    "::text::bigint) "
    "UNION ALL SELECT 1, json_build_array(id, name, key_generation, engine_url, base_model_id, max_lora_rank, "
    "max_loras, state -> 'residency' -> 'gpu', num_requests_running, num_requests_waiting, kv_cache_usage_perc, "
    f"healthy, last_heartbeat_at) FROM {Node._meta.db_table} WHERE change_xid >= %s "  # noqa: S608 (names)
    "UNION ALL SELECT 2, json_build_array(id, node_id, adapter_version_id, tier, served, last_error, warming_since) "
    f"FROM {Placement._meta.db_table} WHERE change_xid >= %s "  # noqa: S608 (names, not input)
    f"UNION ALL SELECT 3, json_build_array(kind, row_id) FROM {FleetGone._meta.db_table} "  # noqa: S608 (names)
    "WHERE change_xid >= %s")


@dataclass(frozen=True)
class NodeRow:
    """One node row as read: its view, and what decides whether it is live.

    Attributes:
        view: the node as the request path sees it (its key already derived).
        healthy: the row's ``healthy``.
        heartbeat_s: the row's ``last_heartbeat_at`` in epoch seconds; None when it never sent one.
    """

    view: NodeView
    healthy: bool
    heartbeat_s: float | None


class PlacementRow(NamedTuple):
    """One placement row as read (``pk`` its primary key): ``view`` is what the gateway routes by, or None when the
    row no longer serves nor failed (cold and not served), so it leaves the view. A tuple: a full read makes
    thousands, and a frozen dataclass costs several times as much to build."""

    pk: int
    node_id: int
    version_id: int
    view: PlacementView | None


class FleetMirror:
    """The rows behind one gateway process's fleet view ("The copy" in the module docstring). Not thread-safe: one
    reader (the gateway's database thread) applies to it."""

    def __init__(self) -> None:
        self._nodes: dict[int, NodeRow] = {}
        self._live: frozenset[int] = frozenset()
        # version → node → placement, for the placements that serve or failed on any node, live or not (a node
        # coming back live brings its rows back without a read).
        self._by_version: dict[int, dict[int, PlacementView]] = {}
        self._where: dict[int, tuple[int, int]] = {}  # placement pk → (version, node)
        self._on_node: dict[int, dict[int, int]] = {}  # node → version → placement pk, as held here
        self._view = FleetView()

    def apply(self, *, full: bool, nodes: Iterable[NodeRow], placements: Iterable[PlacementRow],
              gone_nodes: Iterable[int] = (), gone_placements: Iterable[int] = (), fresh_after_s: float,
              read_at: float, homes: dict[int, tuple[str, ...]]) -> FleetView:
        """Apply one read and return the new view.

        Args:
            full: the rows are everything (every node row with a base model, every placement that serves or
                failed): whatever is not among them is dropped. Otherwise they are the rows written since the
                previous read, in any order, possibly again rows already applied (applying a row is idempotent).
            nodes: node rows read (a node without a base model may be passed: it is never live).
            placements: placement rows read; ``view`` None drops the row from the view.
            gone_nodes: primary keys of node rows deleted since the previous read (ignored when ``full``).
            gone_placements: primary keys of placement rows deleted since the previous read (ignored when ``full``).
            fresh_after_s: epoch seconds; a healthy node whose last heartbeat is older is not live.
            read_at: the view's ``read_at`` (monotonic seconds).
            homes: the reconciler's last plan, ``{version_id: (node name, …)}`` (the view keeps this dict).

        Returns:
            The fleet view: live nodes (healthy, heartbeat at or after ``fresh_after_s``, a base model) in primary
            key order, and their placements per version in node order; equal to what a full read gives.
        """
        dirty: set[int] = set()
        if full:
            self._nodes.clear()
            self._by_version.clear()
            self._where.clear()
            self._on_node.clear()
        nodes_changed = full
        for row in nodes:
            self._nodes[row.view.pk] = row
            nodes_changed = True
        if full:  # one snapshot: each row and each (version, node) pair once, and nothing held to replace
            for pk, node_id, version_id, view in placements:
                if view is not None:
                    self._by_version.setdefault(version_id, {})[node_id] = view
                    self._where[pk] = (version_id, node_id)
                    self._on_node.setdefault(node_id, {})[version_id] = pk
            placements = ()
        for placed in placements:
            self._drop(placed.pk, dirty)
            dirty.add(placed.version_id)
            holder = self._on_node.get(placed.node_id, {}).get(placed.version_id)
            if holder is not None and holder > placed.pk:
                continue  # a newer row holds the pair (keys grow): this one was read before its deletion
            if placed.view is not None:
                self._by_version.setdefault(placed.version_id, {})[placed.node_id] = placed.view
                self._where[placed.pk] = (placed.version_id, placed.node_id)
                self._on_node.setdefault(placed.node_id, {})[placed.version_id] = placed.pk
        # Deletions last: a read made of several statements can return a row and, from a later statement, its
        # deletion (never the reverse: primary keys are not reused), and then the deletion is the newer news.
        if not full:
            for node_id in gone_nodes:
                nodes_changed = self._nodes.pop(node_id, None) is not None or nodes_changed
                # Its placement rows were deleted first (Django deletes the dependent rows; the database has no
                # cascade) and arrive as gone too; dropped here as well, so no row outlives its node.
                for pk in list(self._on_node.get(node_id, {}).values()):
                    self._drop(pk, dirty)
            for pk in gone_placements:
                self._drop(pk, dirty)
        live = frozenset(pk for pk, node in self._nodes.items()
                         if node.healthy and node.view.base_model_id is not None and node.heartbeat_s is not None
                         and node.heartbeat_s >= fresh_after_s)
        for node_id in live ^ self._live:
            dirty.update(self._on_node.get(node_id, ()))
        old = self._view
        view_nodes = old.nodes
        if nodes_changed or live != self._live:
            view_nodes = tuple(self._nodes[pk].view for pk in sorted(live))
        self._live = live
        if full:
            dirty, by_version = set(self._by_version), {}
        else:
            by_version = dict(old.placements) if dirty else old.placements
        for version_id in dirty:
            held = self._by_version.get(version_id)
            shown = tuple(held[n] for n in sorted(held) if n in live) if held else ()
            if shown:
                by_version[version_id] = shown
            else:
                by_version.pop(version_id, None)
        self._view = FleetView(nodes=view_nodes, placements=by_version, read_at=read_at, homes=homes)
        return self._view

    def _drop(self, pk: int, dirty: set[int]) -> None:
        """Forget placement row ``pk`` (if held), marking its version for rebuilding."""
        where = self._where.pop(pk, None)
        if where is None:
            return
        version_id, node_id = where
        dirty.add(version_id)
        on_node = self._on_node.get(node_id)
        # Another row may hold the pair by now (deleted and made again, one read bringing both): keep that one.
        if on_node is None or on_node.get(version_id) != pk:
            return
        del on_node[version_id]
        held = self._by_version[version_id]
        del held[node_id]
        if not held:
            del self._by_version[version_id]


def _gpu_used(value: Any) -> int:
    """The heartbeat's ``residency.gpu`` (jsonb; text on SQLite): GPU slots holding an adapter."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _epoch_s(value: Any) -> float | None:
    """``last_heartbeat_at`` as read raw (an aware datetime from a PostgreSQL column, ISO 8601 text from a change
    read's JSON or from SQLite, where it is UTC without an offset) → epoch seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return float(value.timestamp())


class FleetReader:
    """One gateway process's reads of the fleet, kept in a :class:`FleetMirror`.

    :meth:`load` runs in the gateway's database thread (``Directory``'s fleet cache calls it), one at a time.
    ``last_read`` says what the latest read was (``"full"`` or ``"changes"``) and ``rows_read`` how many rows it
    read (nodes, placements and deletions), for the benchmark and the probes.
    """

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self._mirror = FleetMirror()
        self._full_every_s = full_every_s
        self._since: int | None = None  # the next change read's first stamp; None: the next read is full
        self._full_at = float("-inf")
        self._keys: dict[tuple[str, str, int], str] = {}
        self._resets = 0
        self.last_read = ""
        self.rows_read = 0

    def reset(self) -> None:
        """Make the next read a full one. Safe from any thread (the bus's listener calls it): a read in progress
        then leaves the next one full too, rather than setting its own cursor over the reset."""
        self._resets += 1
        self._since = None

    def load(self) -> FleetView:
        """Live nodes (healthy, heartbeat within ``QUIVER_NODE_STALE_AFTER_S``, a base model), every placement on
        them that serves or failed, and the reconciler's last plan (one Redis read at most every
        ``inference.fleet.plan.PLAN_CACHE_S``): a full read or a change read (module docstring), same view.

        Raises:
            django.db.Error: the database failed; the next read is then a full one.
        """
        started = time.monotonic()
        since, resets = self._since, self._resets
        postgres = connection.vendor == "postgresql"
        full = not postgres or since is None or started - self._full_at >= self._full_every_s
        try:
            with connection.cursor() as cursor:
                next_since = None
                gone: list[tuple[str, int]] = []
                if full:
                    if postgres:
                        cursor.execute(_CURSOR_SQL)
                        next_since = cursor.fetchone()[0]
                    cursor.execute(_NODE_SQL + "WHERE healthy = %s AND base_model_id IS NOT NULL", [True])
                    node_rows = cursor.fetchall()
                    cursor.execute(_PLACEMENT_SQL + "WHERE NOT (tier = %s AND served = %s)",
                                   [Placement.Tier.COLD.value, False])
                    placement_rows = cursor.fetchall()
                else:
                    cursor.execute(_CHANGES_SQL, [since, since, since])
                    node_rows, placement_rows = [], []
                    for kind, values in cursor.fetchall():
                        row = tuple(json.loads(values) if isinstance(values, (str, bytes)) else values)
                        if kind == 0:
                            next_since = row[0]
                        elif kind == 1:
                            node_rows.append(row)
                        elif kind == 2:
                            placement_rows.append(row)
                        else:
                            gone.append((row[0], row[1]))
            fresh_after = dj_timezone.now() - timedelta(seconds=settings.QUIVER_NODE_STALE_AFTER_S)
            view = self._mirror.apply(
                full=full, nodes=[self._node(row) for row in node_rows],
                placements=[self._placement(row) for row in placement_rows],
                gone_nodes=[pk for kind, pk in gone if kind == "node"],
                gone_placements=[pk for kind, pk in gone if kind == "placement"],
                fresh_after_s=fresh_after.timestamp(), read_at=time.monotonic(), homes=plan_all())
        except BaseException:
            self._since = None  # whatever was applied or not, start over from a full read
            raise
        if full:
            self._full_at = started
        self._since = next_since if resets == self._resets else None
        self.last_read = "full" if full else "changes"
        self.rows_read = len(node_rows) + len(placement_rows) + len(gone)
        return view

    def _node(self, row: tuple[Any, ...]) -> NodeRow:
        (pk, name, generation, engine_url, base_model_id, max_lora_rank, max_loras, gpu, running, waiting, kv,
         healthy, heartbeat_at) = row
        cache_key = (settings.QUIVER_NODE_SECRET, name, generation)
        key = self._keys.get(cache_key)
        if key is None:
            if len(self._keys) > 100_000:  # names come from operators, but bound it anyway
                self._keys.clear()
            key = self._keys[cache_key] = node_credentials(name, generation).key
        view = NodeView(pk=pk, name=name, engine_url=engine_url.rstrip("/"), base_model_id=base_model_id, key=key,
                        max_lora_rank=max_lora_rank, max_loras=max_loras, gpu_used=_gpu_used(gpu),
                        num_requests_running=running or 0, num_requests_waiting=waiting or 0,
                        kv_cache_usage_perc=kv or 0.0)
        return NodeRow(view=view, healthy=bool(healthy), heartbeat_s=_epoch_s(heartbeat_at))

    @staticmethod
    def _placement(row: tuple[Any, ...]) -> PlacementRow:
        pk, node_id, version_id, tier, served, last_error, warming_since = row
        if tier == Placement.Tier.COLD and not served:
            return PlacementRow(pk=pk, node_id=node_id, version_id=version_id, view=None)
        code = (last_error or "").split(":", 1)[0] if tier == Placement.Tier.ERRORED and warming_since is None else ""
        return PlacementRow(pk=pk, node_id=node_id, version_id=version_id,
                            view=PlacementView(node_id=node_id, version_id=version_id, tier=tier, served=bool(served),
                                               error_code=code))


def load_fleet() -> FleetView:
    """The fleet view from a full read by a fresh :class:`FleetReader`, for callers that read it once (tests, tools);
    a gateway process keeps one reader (``Directory``) and reads changes."""
    return FleetReader().load()
