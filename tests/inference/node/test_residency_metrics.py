from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from inference.node.residency_metrics import render


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_gauges_follow_the_state_report() -> None:
    state = {"max_loras": 2, "max_cpu_loras": 4,
             "residency": {"source": "engine", "gpu": 2, "cpu": 1, "disk": 3, "errored": 1, "pinned": 1,
                           "gpu_bytes": 2048, "cpu_bytes": 900, "disk_bytes": 5000}}
    got = _samples(render(state))
    assert got[("quiver_node_lora_adapters", (("tier", "gpu"),))] == 2
    assert got[("quiver_node_lora_adapters", (("tier", "errored"),))] == 1
    assert got[("quiver_node_lora_bytes", (("tier", "disk"),))] == 5000
    assert got[("quiver_node_lora_slots", (("tier", "cpu"),))] == 4
    assert got[("quiver_node_lora_pinned", ())] == 1
    assert got[("quiver_node_residency_from_engine", ())] == 1


def test_missing_residency_reads_as_zero_and_not_from_engine() -> None:
    got = _samples(render({"max_loras": None}))
    assert got[("quiver_node_lora_adapters", (("tier", "cpu"),))] == 0
    assert got[("quiver_node_residency_from_engine", ())] == 0


def test_engine_loads_and_move_seconds_reach_the_gauges() -> None:
    from inference.node.state_report import residency_summary

    engine = {"slot_bytes": 10, "bytes": {"3": 100}, "loads_total": 7,
              "moves": {"disk_to_cpu": 7, "cpu_to_gpu": 9, "disk_to_cpu_s": 0.25, "cpu_to_gpu_s": 0.5}}
    summary = residency_summary([{"tier": "hot", "pinned": False}], engine, 0)
    assert summary["loads_total"] == 7 and summary["move_seconds"] == 0.75
    got = _samples(render({"max_loras": 2, "residency": summary}))
    assert got[("quiver_node_lora_loads", ())] == 7
    assert got[("quiver_node_lora_move_seconds", ())] == 0.75
    assert residency_summary([], None, 0)["move_seconds"] is None
