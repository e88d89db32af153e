"""Routing sees each node's running LoRA batch: the engine's published list plus this process's sends since."""

from __future__ import annotations

from inference.gateway.loadboard import LoadBoard
from inference.gateway.snapshot import FleetView, NodeView, PlacementView, TargetView, node_choose
from inference.policy.admission import NodeLoad

TARGET = TargetView(requested="support", base_model_id=1, base_model_name="tiny", served_name="acme--support",
                    version_id=7, version_number=1, r=8)


def _fleet(batch_1: frozenset[str] | None) -> FleetView:
    nodes = (NodeView(1, "node-1", "http://n1", 1, max_lora_rank=16, max_loras=2, running_loras=batch_1),
             NodeView(2, "node-2", "http://n2", 1, max_lora_rank=16, max_loras=2, running_loras=frozenset()))
    # node-1 is the plan's home and holds it in a GPU slot; node-2 still serves it from its disk.
    placements = {7: (PlacementView(1, 7, "hot", True), PlacementView(2, 7, "staged", True))}
    return FleetView(nodes=nodes, placements=placements, homes={7: ("node-1",)})


def test_a_request_leaves_a_home_whose_batch_is_full_of_other_adapters() -> None:
    assert node_choose(_fleet(frozenset({"globex--sql", "initech--bot"})), TARGET).name == "node-2"
    assert node_choose(_fleet(frozenset({"globex--sql", "acme--support"})), TARGET).name == "node-1"  # joins it
    assert node_choose(_fleet(frozenset({"globex--sql"})), TARGET).name == "node-1"  # room for one more
    assert node_choose(_fleet(None), TARGET).name == "node-1"  # the engine does not say: residency decides


def test_sends_since_the_figures_count_in_the_batch_until_newer_figures() -> None:
    board = LoadBoard()
    board.apply(["node-1", "node-2"], [None, None])
    board.loads = {"node-1": NodeLoad(at_s=100.0, running_loras=("globex--sql",)),
                   "node-2": NodeLoad(at_s=100.0, running_loras=())}
    fleet = _fleet(None)

    assert board.overlay(fleet, now_s=100.1, max_age_s=1.0).nodes[0].running_loras == {"globex--sql"}
    board.note_sent("node-1", 100.05, lora="initech--bot")
    view = board.overlay(fleet, now_s=100.1, max_age_s=1.0)
    assert view.nodes[0].running_loras == {"globex--sql", "initech--bot"}
    assert node_choose(view, TARGET).name == "node-2"  # the send filled node-1's second slot

    board.loads = {**board.loads, "node-1": NodeLoad(at_s=100.2, running_loras=("globex--sql",))}
    board.version += 1
    assert board.overlay(fleet, now_s=100.3, max_age_s=1.0).nodes[0].running_loras == {"globex--sql"}


def test_a_malformed_published_value_counts_as_unknown_figures_and_never_raises() -> None:
    """A node's published load is checked as a heartbeat is: a string or NaN figure raised in the overlay and the
    admission gate on every request, and a string ``running_loras`` was read letter by letter (a full batch)."""
    import json

    from inference.policy.admission import SaturationConfig, node_saturated

    board = LoadBoard()
    names = ["node-1", "node-2"]
    garbage = [json.dumps({"at_s": "100", "num_requests_waiting": 1}), '{"at_s": 100.0, "num_requests_waiting": NaN}']
    board.apply(names, garbage)
    assert board.get("node-1") is None and board.get("node-2") is None
    for name in names:
        node_saturated(board.get(name), now_s=100.1, config=SaturationConfig())

    board.apply(names, [json.dumps({"at_s": 100.0, "running_loras": "globex--sql"}),
                        json.dumps({"at_s": 100.0, "running_loras": [f"x--{i}" for i in range(100_000)]})])
    view = board.overlay(_fleet(None), now_s=100.1, max_age_s=1.0)
    assert [n.running_loras for n in view.nodes] == [None, None]  # unknown: residency decides
    assert node_choose(view, TARGET).name == "node-1"
