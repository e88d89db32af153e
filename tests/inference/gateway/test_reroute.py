"""An adapter evicted under the gateway's feet: on an engine 404 the gateway routes again, a bounded number of times,
before the client sees an error; a request waiting for a warm asks for it again (bench_fleet under thrash)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from prometheus_client import REGISTRY

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.gateway import app as gateway_app
from inference.gateway import exchange as gateway_exchange
from inference.gateway.app import GatewayApp
from inference.gateway.exchange import MAX_REROUTES
from inference.gateway.snapshot import NodeView
from tenants.services import api_key_create
from tests.factories import TenantFactory
from tests.fixtures.engine_answer import EngineAnswer

NODE = NodeView(pk=1, name="n1", engine_url="http://engine.invalid", base_model_id=1)




def _run(monkeypatch: pytest.MonkeyPatch, statuses: list[int]) -> tuple[httpx.Response, list[Any], list[EngineAnswer]]:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                  s3_prefix="x/", files=[], status="ready")
    answers: list[EngineAnswer] = []
    marked: list[Any] = []

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> EngineAnswer:
        status = statuses[min(len(answers), len(statuses) - 1)]
        body = ({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}} if status == 200 else
                {"error": {"message": "The model `t--bot--1` does not exist.", "type": "NotFoundError", "code": 404}})
        answers.append(EngineAnswer(status, body))
        return answers[-1]

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    monkeypatch.setattr(gateway_exchange, "placement_mark_not_served", lambda node_id, version_id: marked.append((node_id, version_id)))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=GatewayApp(background=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "bot", "prompt": "x", "max_tokens": 1})

    return async_to_sync(go)(), marked, answers


@pytest.mark.django_db
def test_repeated_engine_404s_are_routed_again_until_a_node_answers(monkeypatch: pytest.MonkeyPatch,
                                                                    base_model: Any) -> None:
    response, marked, answers = _run(monkeypatch, [404] * MAX_REROUTES + [200])
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "ok" and response.json()["model"] == "bot"
    assert len(answers) == MAX_REROUTES + 1 and len(marked) == MAX_REROUTES  # each 404 recorded as not served
    assert all(a.closed for a in answers)


@pytest.mark.django_db
def test_the_time_to_the_engine_is_observed_once_per_request_reroutes_aside(monkeypatch: pytest.MonkeyPatch,
                                                                             base_model: Any) -> None:
    def seen() -> tuple[float, float]:
        labels = {"endpoint": "completions"}
        return (REGISTRY.get_sample_value("quiver_gateway_time_to_engine_seconds_count", labels) or 0.0,
                REGISTRY.get_sample_value("quiver_gateway_time_to_engine_seconds_sum", labels) or 0.0)

    count0, sum0 = seen()
    started = time.monotonic()
    response, _, answers = _run(monkeypatch, [404, 200])
    elapsed = time.monotonic() - started
    count1, sum1 = seen()
    assert response.status_code == 200 and len(answers) == 2
    assert count1 - count0 == 1  # one request, two engine calls: the gateway's own time is counted once
    assert 0 < sum1 - sum0 < elapsed


@pytest.mark.django_db
def test_reroutes_are_bounded_and_the_last_404_is_an_openai_error_without_engine_names(
        monkeypatch: pytest.MonkeyPatch, base_model: Any) -> None:
    response, marked, answers = _run(monkeypatch, [404])
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_available", "model")
    assert "t--bot--1" not in response.text and "NotFoundError" not in response.text
    assert len(answers) == MAX_REROUTES + 1 and len(marked) == MAX_REROUTES


@pytest.mark.django_db
def test_a_request_waiting_for_a_warm_asks_again_while_its_adapter_is_not_served(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Under eviction pressure a node can drop the adapter between its warm and the gateway's next poll; nothing
    else would load it again, so the waiting request re-asks (deduplicated by ``placement_request_warm``)."""
    from inference.gateway.errors import GatewayError
    from inference.gateway.snapshot import FleetView, TargetView

    settings.QUIVER_WARM_WAIT_S = 1.0
    monkeypatch.setattr(gateway_app, "REWARM_S", 0.25)
    asks: list[tuple[int, int | None]] = []
    monkeypatch.setattr(gateway_app, "warm_for_request", lambda version_id, node_id=None: asks.append(
        (version_id, node_id)) or NODE.pk)
    fleet = FleetView(nodes=(NODE,), placements={}, read_at=0.0)  # the node never serves the version

    async def go() -> None:
        app = GatewayApp(background=False)

        async def fleet_now(*_: Any) -> FleetView:
            return fleet

        monkeypatch.setattr(app.directory, "fleet", fleet_now)
        monkeypatch.setattr(app.directory, "fleet_fresh", fleet_now)
        target = TargetView(requested="bot", base_model_id=1, base_model_name="tiny-llama", served_name="t--bot--7",
                            version_id=7, version_number=1, r=8)
        with pytest.raises(GatewayError) as raised:
            await app.node_for(target)
        assert raised.value.code == "adapter_warm_timeout"

    async_to_sync(go)()
    assert len(asks) >= 3 and {version for version, _ in asks} == {7}  # the first ask, then every 0.25 s
    assert asks[0] == (7, None) and set(asks[1:]) == {(7, NODE.pk)}  # again on the node the first ask chose


def _node_for(monkeypatch: pytest.MonkeyPatch, fleet_now: Any) -> NodeView:
    from inference.gateway.snapshot import TargetView

    async def go() -> NodeView:
        app = GatewayApp(background=False)
        monkeypatch.setattr(app.directory, "fleet", fleet_now)
        monkeypatch.setattr(app.directory, "fleet_fresh", fleet_now)
        target = TargetView(requested="bot", base_model_id=1, base_model_name="tiny-llama", served_name="t--bot--7",
                            version_id=7, version_number=1, r=8)
        return await app.node_for(target)

    return async_to_sync(go)()


@pytest.mark.django_db
def test_a_request_waiting_for_a_warm_asks_another_node_once_the_first_is_gone(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The node the first ask chose is killed: once it leaves the live fleet the re-ask names no node, so the best
    live one loads the adapter (CI: a request waited out the whole warm wait re-asking a dead node)."""
    from inference.gateway.snapshot import FleetView, PlacementView

    other = NodeView(pk=2, name="n2", engine_url="http://engine-2.invalid", base_model_id=1)
    settings.QUIVER_WARM_WAIT_S = 5.0
    monkeypatch.setattr(gateway_app, "REWARM_S", 0.25)
    asks: list[int | None] = []
    polls = 0

    def warm_request(version_id: int, node_id: int | None = None) -> int:
        asks.append(node_id)
        return NODE.pk if len(asks) == 1 else other.pk  # the first ask picks n1; later ones the live n2

    monkeypatch.setattr(gateway_app, "warm_for_request", warm_request)

    async def fleet_now(*_: Any) -> FleetView:
        nonlocal polls
        polls += 1
        if polls == 1:
            return FleetView(nodes=(NODE, other), placements={}, read_at=0.0)  # the first ask's view
        if len(asks) < 3:
            return FleetView(nodes=(other,), placements={}, read_at=0.0)  # n1 went stale at once
        served = PlacementView(node_id=other.pk, version_id=7, tier="hot", served=True)
        return FleetView(nodes=(other,), placements={7: (served,)}, read_at=0.0)

    assert _node_for(monkeypatch, fleet_now) == other
    assert asks[:2] == [None, None]  # the first ask, then one naming no node: n1 had left the fleet
    assert all(node_id == other.pk for node_id in asks[2:])


@pytest.mark.django_db
def test_a_move_to_the_plans_home_serves_from_the_holder_at_once_and_warms_the_home_behind(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The plan moved the version to n2, which does not hold it; n1 still serves it. The request goes to n1 without
    waiting for the warm, which is asked of n2 in the background once (a second request within REWARM_S does not
    ask again)."""
    from inference.gateway.snapshot import FleetView, PlacementView, TargetView

    first = replace(NODE, max_lora_rank=16)
    other = NodeView(pk=2, name="n2", engine_url="http://engine-2.invalid", base_model_id=1, max_lora_rank=16)
    settings.QUIVER_WARM_WAIT_S = 30.0
    asks: list[int | None] = []
    monkeypatch.setattr(gateway_app, "warm_for_request", lambda version_id, node_id=None: asks.append(node_id) or 2)
    held = PlacementView(node_id=NODE.pk, version_id=7, tier="warm", served=True)

    async def fleet_now(*_: Any) -> FleetView:
        return FleetView(nodes=(first, other), placements={7: (held,)}, read_at=0.0, homes={7: ("n2",)})

    async def go() -> list[NodeView]:
        app = GatewayApp(background=False)
        monkeypatch.setattr(app.directory, "fleet", fleet_now)
        target = TargetView(requested="bot", base_model_id=1, base_model_name="tiny-llama", served_name="t--bot--7",
                            version_id=7, version_number=1, r=8)
        chosen = [await app.node_for(target), await app.node_for(target)]
        await asyncio.gather(*app._background)  # the move's warm, before this short-lived loop closes
        return chosen

    started = time.monotonic()
    assert async_to_sync(go)() == [first, first]
    assert time.monotonic() - started < gateway_app.POLL_S  # no wait for the warm
    assert asks == [other.pk]  # it did ask for the move, once


@pytest.mark.django_db
def test_a_warm_whose_node_left_the_fleet_is_asked_of_another_node(
        monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Round-robin's turn (or a plan home) was n1, which then died, and no node holds the version: the request
    re-asks for the warm on the best live node instead of answering 503 no_capacity."""
    from inference.gateway.snapshot import FleetView, PlacementView

    other = NodeView(pk=2, name="n2", engine_url="http://engine-2.invalid", base_model_id=1)
    settings.QUIVER_WARM_WAIT_S = 10.0
    settings.QUIVER_ROUTING_POLICY = "round_robin"
    asks: list[int | None] = []

    def warm_request(version_id: int, node_id: int | None = None) -> int:
        asks.append(node_id)
        return node_id if node_id is not None else other.pk

    monkeypatch.setattr(gateway_app, "warm_for_request", warm_request)
    polls = 0

    async def fleet_now(*_: Any) -> FleetView:
        nonlocal polls
        polls += 1
        if polls == 1:
            return FleetView(nodes=(NODE, other), placements={}, read_at=0.0)
        if None not in asks:
            return FleetView(nodes=(other,), placements={}, read_at=0.0)  # n1 died
        served = PlacementView(node_id=other.pk, version_id=7, tier="hot", served=True)
        return FleetView(nodes=(other,), placements={7: (served,)}, read_at=0.0)

    chosen = _node_for(monkeypatch, fleet_now)
    assert chosen == other and asks[-1] is None


@pytest.mark.django_db
def test_the_route_log_names_each_requests_node_tier_and_engine_id(monkeypatch: pytest.MonkeyPatch,
                                                                     base_model: Any, caplog: Any) -> None:
    """With ``inference.gateway.route`` at INFO (``QUIVER_GATEWAY_ROUTE_LOG``, scripts/bench_fleet's recordings), a
    request that reached an engine is logged once with the engine's request id, the node it ended on, the version's
    tier there in the fleet view the process routed by, and the 404s it was routed around."""
    from inference.gateway.directory import Directory
    from inference.gateway.snapshot import FleetView, PlacementView

    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                            s3_prefix="x/", files=[], status="ready")
    ids: list[str | None] = []

    async def upstream_post(url: str, *, content: bytes, node_key: str, request_id: str | None = None) -> EngineAnswer:
        ids.append(request_id)
        status = 404 if len(ids) == 1 else 200
        return EngineAnswer(status, {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                            if status == 200 else {"error": {"message": "gone", "type": "NotFoundError", "code": 404}})

    async def node_for(self: GatewayApp, target: Any) -> NodeView:
        return NODE

    monkeypatch.setattr(gateway_exchange, "upstream_post", upstream_post)
    monkeypatch.setattr(GatewayApp, "node_for", node_for)
    monkeypatch.setattr(gateway_exchange, "placement_mark_not_served", lambda node_id, version_id: None)
    staged = PlacementView(node_id=NODE.pk, version_id=version.pk, tier="staged", served=True)

    # The view this process routes by (its directory is made per event loop: patched on the class).
    monkeypatch.setattr(Directory, "fleet_seen", lambda self: FleetView(
        nodes=(NODE,), placements={version.pk: (staged,)}, read_at=time.monotonic()))

    async def go() -> httpx.Response:
        app = GatewayApp(background=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            return await http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                                   json={"model": "bot", "prompt": "x", "max_tokens": 1})

    caplog.set_level("INFO", logger="inference.gateway.route")
    assert async_to_sync(go)().status_code == 200
    lines = [r for r in caplog.records if r.name == "inference.gateway.route" and r.getMessage() == "gateway.route"]
    assert len(lines) == 1 and len(ids) == 2 and ids[0] == ids[1]
    line = lines[0]
    assert (line.rid, line.node, line.version_id, line.tier, line.reroutes) == (ids[1], "n1", version.pk, "staged", 1)
    assert abs(line.t - time.time()) < 60


def test_the_directory_peeks_at_its_fleet_view_without_loading() -> None:
    from inference.gateway.directory import Directory, _Entry
    from inference.gateway.snapshot import FleetView

    directory = Directory()
    assert directory.fleet_seen() is None  # nothing read yet, and peeking reads nothing
    view = FleetView(nodes=(NODE,), read_at=1.0)
    directory._fleet._entries[()] = _Entry(view, time.monotonic() - 3600)  # however old
    assert directory.fleet_seen() is view
    directory.invalidate("fleet")
    assert directory.fleet_seen() is None


@pytest.mark.django_db
def test_a_node_that_came_live_after_the_last_read_serves_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """No 503 ``no_capacity`` from a view that predates the node: one fresh read first (the console journey's first
    request after its node re-registered was refused so)."""
    from inference.gateway.snapshot import FleetView, TargetView

    stale = FleetView(nodes=(), placements={}, read_at=0.0)
    fresh = FleetView(nodes=(NODE,), placements={}, read_at=1.0)
    reads: list[float] = []

    async def go() -> NodeView:
        app = GatewayApp(background=False)

        async def fleet_cached() -> FleetView:
            return stale

        async def fleet_fresh(max_age_s: float) -> FleetView:
            reads.append(max_age_s)
            return fresh

        monkeypatch.setattr(app.directory, "fleet", fleet_cached)
        monkeypatch.setattr(app.directory, "fleet_fresh", fleet_fresh)
        target = TargetView(requested="tiny-llama", base_model_id=1, base_model_name="tiny-llama",
                            served_name="tiny-llama", version_id=None, version_number=None, r=0)
        return await app.node_for(target)

    assert async_to_sync(go)() == NODE
    assert reads == [gateway_app.NO_NODE_REREAD_S]
