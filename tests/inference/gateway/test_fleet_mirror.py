"""A fleet view kept from changed rows equals the view of a full read of the same rows, whatever the sequence of
writes, deletions and liveness changes (``inference.gateway.fleet_reader.FleetMirror``; no database)."""

from __future__ import annotations

import random

import pytest

from inference.gateway.fleet_reader import FleetMirror, NodeRow, PlacementRow
from inference.gateway.snapshot import FleetView, NodeView, PlacementView

TIERS = ("cold", "staged", "warm", "hot", "errored")


def _node(pk: int, *, healthy: bool = True, heartbeat_s: float | None = 100.0, base: int | None = 1,
          running: int = 0) -> NodeRow:
    return NodeRow(view=NodeView(pk=pk, name=f"n{pk}", engine_url=f"http://n{pk}", base_model_id=base,
                                 num_requests_running=running), healthy=healthy, heartbeat_s=heartbeat_s)


def _placement(pk: int, node_id: int, version_id: int, tier: str, served: bool = True) -> PlacementRow:
    view = None if tier == "cold" and not served else PlacementView(node_id=node_id, version_id=version_id,
                                                                     tier=tier, served=served)
    return PlacementRow(pk=pk, node_id=node_id, version_id=version_id, view=view)


def _full(nodes: dict[int, NodeRow], placements: dict[int, PlacementRow], fresh_after_s: float) -> FleetView:
    """What a fresh mirror makes of a full read of these rows (the reader's first read)."""
    return FleetMirror().apply(full=True, nodes=list(nodes.values()),
                               placements=[p for p in placements.values() if p.view is not None],
                               fresh_after_s=fresh_after_s, read_at=0.0, homes={})


def _same(a: FleetView, b: FleetView) -> bool:
    return a.nodes == b.nodes and a.placements == b.placements


def test_rows_leave_and_come_back_with_their_node() -> None:
    mirror = FleetMirror()
    nodes = {1: _node(1), 2: _node(2)}
    placements = {10: _placement(10, 1, 7, "hot"), 11: _placement(11, 2, 7, "warm"), 12: _placement(12, 2, 8, "staged")}
    view = mirror.apply(full=True, nodes=list(nodes.values()), placements=list(placements.values()),
                        fresh_after_s=50.0, read_at=1.0, homes={7: ("n1",)})
    assert [n.pk for n in view.nodes] == [1, 2] and len(view.placements[7]) == 2 and view.homes == {7: ("n1",)}

    # Node 2 goes unhealthy (an UPDATE of its row only): it and its placements leave the view.
    view = mirror.apply(full=False, nodes=[_node(2, healthy=False)], placements=[], fresh_after_s=50.0,
                        read_at=2.0, homes={})
    assert [n.pk for n in view.nodes] == [1] and view.placements == {7: (placements[10].view,)}
    # Healthy again: they come back without their rows being read again.
    view = mirror.apply(full=False, nodes=[_node(2)], placements=[], fresh_after_s=50.0, read_at=3.0, homes={})
    assert len(view.placements[7]) == 2 and view.placements[8] == (placements[12].view,)
    # Node 1's last heartbeat falls behind the cut-off with no write at all: it leaves.
    view = mirror.apply(full=False, nodes=[], placements=[], fresh_after_s=150.0, read_at=4.0, homes={})
    assert view.nodes == ()  # both heartbeats were at 100
    view = mirror.apply(full=False, nodes=[_node(2, heartbeat_s=200.0)], placements=[_placement(10, 1, 7, "cold",
                        served=False)], gone_placements=[12], fresh_after_s=150.0, read_at=5.0, homes={})
    assert [n.pk for n in view.nodes] == [2] and view.placements == {7: (placements[11].view,)}
    # Deleted node: gone from the mirror, its rows too, even if their own deletions were not passed.
    view = mirror.apply(full=False, nodes=[], placements=[], gone_nodes=[2], fresh_after_s=150.0, read_at=6.0,
                        homes={})
    assert view.nodes == () and view.placements == {}
    view = mirror.apply(full=False, nodes=[_node(2, heartbeat_s=300.0)], placements=[], fresh_after_s=150.0,
                        read_at=7.0, homes={})
    assert [n.pk for n in view.nodes] == [2] and view.placements == {}


def test_a_view_handed_out_is_never_changed_by_later_reads() -> None:
    mirror = FleetMirror()
    first = mirror.apply(full=True, nodes=[_node(1)], placements=[_placement(10, 1, 7, "hot")], fresh_after_s=0.0,
                         read_at=1.0, homes={})
    held = dict(first.placements)
    mirror.apply(full=False, nodes=[_node(1, running=5)], placements=[_placement(10, 1, 7, "cold", served=False),
                 _placement(11, 1, 8, "warm")], fresh_after_s=0.0, read_at=2.0, homes={})
    assert first.placements == held and first.nodes[0].num_requests_running == 0


@pytest.mark.parametrize("seed", range(40))
def test_changes_applied_in_any_sequence_equal_a_full_read(seed: int) -> None:
    rng = random.Random(seed)
    nodes: dict[int, NodeRow] = {}
    placements: dict[int, PlacementRow] = {}
    mirror = FleetMirror()
    mirror.apply(full=True, nodes=[], placements=[], fresh_after_s=0.0, read_at=0.0, homes={})
    next_pk, now = 100, 100.0
    dead: set[int] = set()
    for _ in range(60):
        now += rng.uniform(0, 10)
        changed_nodes: list[NodeRow] = []
        changed: list[PlacementRow] = []
        gone_nodes: list[int] = []
        gone: list[int] = []
        for _ in range(rng.randint(0, 6)):
            op = rng.random()
            if op < 0.3 or not nodes:
                pk = rng.choice([k for k in range(len(dead) + 1, len(dead) + 9) if k not in dead])
                nodes[pk] = _node(pk, healthy=rng.random() < 0.8, heartbeat_s=now - rng.uniform(0, 40),
                                  base=rng.choice([1, 1, 1, None]), running=rng.randint(0, 3))
                changed_nodes.append(nodes[pk])
            elif op < 0.75:
                node_id, version_id = rng.choice(list(nodes)), rng.randint(1, 12)
                pk = next((k for k, p in placements.items() if (p.node_id, p.version_id) == (node_id, version_id)),
                          None)
                if pk is None:
                    pk, next_pk = next_pk, next_pk + 1
                placements[pk] = _placement(pk, node_id, version_id, rng.choice(TIERS), served=rng.random() < 0.7)
                changed.append(placements[pk])
            elif op < 0.9 and placements:
                pk = rng.choice(list(placements))
                del placements[pk]
                gone.append(pk)
            else:
                pk = rng.choice(list(nodes))
                del nodes[pk]
                dead.add(pk)  # primary keys are not reused
                gone_nodes.append(pk)
                for k in [k for k, p in placements.items() if p.node_id == pk]:
                    del placements[k]
                    gone.append(k)
        # A change read returns each row once as it is now; a row deleted since may still come (read before its
        # deletion, by an earlier statement) beside its deletion; rows already applied may come again (a long
        # transaction holds the reader's cursor back).
        last = {p.pk: p for p in changed}
        changed = [placements.get(pk, row) for pk, row in last.items() if pk in placements or rng.random() < 0.5]
        changed += rng.sample(list(placements.values()), min(2, len(placements)))
        rng.shuffle(changed)
        changed_nodes = [nodes[pk] for pk in {n.view.pk for n in changed_nodes} if pk in nodes]
        fresh_after_s = now - 30.0
        view = mirror.apply(full=False, nodes=changed_nodes, placements=changed, gone_nodes=gone_nodes,
                            gone_placements=gone, fresh_after_s=fresh_after_s, read_at=now, homes={})
        assert _same(view, _full(nodes, placements, fresh_after_s))
