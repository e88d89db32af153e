"""Each fleet decision has one answer: production and ``scripts/simulate`` call the same pure function for where a
version lives (``place``), where it loads when a request needs it (``warm_target``), which nodes may serve a request
(``plan_candidates``) and which of them does (``route``), and which adapter leaves a node's full engine CPU cache
(``node_victims``: the agent, the engine's worker extension and the simulator; it ranks with ``choose_victims``,
which the reconciler's quota trim calls too)."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from inference.policy import eviction, node_eviction, placement, routing

DECISIONS: dict[str, tuple[Callable[..., Any], list[str]]] = {
    # decision: (the pure function, the production modules that call it by that name)
    "place": (placement.place, ["inference.fleet.reconcile"]),
    "warm_target": (placement.warm_target, ["inference.fleet.warming"]),
    "route": (routing.route, ["inference.gateway.snapshot"]),
    "plan_candidates": (routing.plan_candidates, ["inference.gateway.snapshot"]),
    "node_victims": (node_eviction.node_victims, ["inference.node.eviction", "inference.node.worker_ext"]),
}


def test_the_node_rule_ranks_with_the_one_victim_order() -> None:
    assert node_eviction.choose_victims is eviction.choose_victims
    assert importlib.import_module("inference.fleet.reconcile").choose_victims is eviction.choose_victims


@pytest.mark.parametrize("name", sorted(DECISIONS))
def test_production_and_the_simulator_bind_the_same_function(name: str) -> None:
    function, production = DECISIONS[name]
    simulator = importlib.import_module("devtools.simulate.policies")
    assert getattr(simulator, name) is function
    for module in production:
        assert getattr(importlib.import_module(module), name) is function, module


def test_a_simulator_run_calls_each_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bindings above are used: a short simulated run goes through every one of them."""
    from devtools.simulate import __main__ as simulate
    from devtools.simulate import policies

    calls: Counter[str] = Counter()
    for name, (function, _) in DECISIONS.items():
        def spy(*args: Any, _f: Callable[..., Any] = function, _n: str = name, **kwargs: Any) -> Any:
            calls[_n] += 1
            return _f(*args, **kwargs)
        monkeypatch.setattr(policies, name, spy)
    args = simulate.parse(["--adapters", "60", "--nodes", "3", "--gpu-slots", "2", "--cpu-slots", "6",
                           "--requests", "3000", "--seed", "2", "--policies", "quiver"])
    simulate.run(args)
    assert set(calls) == set(DECISIONS), calls
