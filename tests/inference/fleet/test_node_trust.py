"""Node trust: nodes are registered with their URLs; a heartbeat can change neither identity nor URLs; forged or
malformed heartbeats change nothing; node routes and the admin are not on the public listener."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone

from adapters_app.models import Purge
from inference.fleet.models import Node, Placement, VersionIntent
from inference.fleet.node_keys import node_credentials
from inference.fleet.nodes import node_register
from inference.fleet.warming import placement_mark_load_issued

pytestmark = pytest.mark.django_db
URL = "/internal/v1/nodes/heartbeat"


def _state(name: str, **extra: Any) -> dict[str, Any]:
    return {"node": name, "healthy": True, "base_model": "tiny-llama", "engine_url": f"http://{name}:8000",
            "agent_url": f"http://{name}:8100", "max_loras": 2, "max_cpu_loras": 4, "max_lora_rank": 16,
            "adapters": [], "kv_cache_usage_perc": 0.1, "num_requests_running": 0, "num_requests_waiting": 0,
            **extra}


def _register(name: str) -> str:
    _, creds = node_register(name=name, agent_url=f"http://{name}:8100", engine_url=f"http://{name}:8000",
                             base_model_name="tiny-llama")
    return creds.token


@pytest.fixture
def internal() -> Any:
    with override_settings(ROOT_URLCONF="config.internal_urls"):
        yield Client()


def _beat(client: Client, token: str, state: Any) -> Any:
    return client.post(URL, data=json.dumps(state), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def _snapshot() -> list[tuple[Any, ...]]:
    return list(Node.objects.order_by("name").values_list(
        "name", "agent_url", "engine_url", "healthy", "last_heartbeat_at", "num_requests_waiting", "state",
        "key_generation"))


def test_a_registered_node_heartbeats_with_its_own_token(internal: Client, base_model: Any) -> None:
    token = _register("n1")
    resp = _beat(internal, token, _state("n1", num_requests_waiting=3))
    assert resp.status_code == 200, resp.content
    node = Node.objects.get(name="n1")
    assert node.healthy and node.num_requests_waiting == 3 and node.engine_url == "http://n1:8000"


@pytest.mark.parametrize(("forge", "status", "code"), [
    ("wrong_key", 401, "invalid_node_token"),
    ("unregistered", 401, "invalid_node_token"),
    ("other_name", 403, "node_identity_mismatch"),
    ("new_engine_url", 409, "node_urls_changed"),
    ("new_agent_url", 409, "node_urls_changed"),
    ("other_base_model", 409, "base_model_mismatch"),
])
def test_a_forged_heartbeat_changes_nothing(internal: Client, base_model: Any, forge: str, status: int,
                                            code: str) -> None:
    token_a = _register("node-a")
    _register("node-b")
    assert _beat(internal, token_a, _state("node-a")).status_code == 200
    before = _snapshot()
    token, state = {
        "wrong_key": (token_a[:-4] + "AAAA", _state("node-a", num_requests_waiting=99)),
        "unregistered": (node_credentials("node-x").token, _state("node-x")),
        "other_name": (token_a, _state("node-b", engine_url="http://node-a:8000", agent_url="http://node-a:8100")),
        "new_engine_url": (token_a, _state("node-a", engine_url="http://evil:8000")),
        "new_agent_url": (token_a, _state("node-a", agent_url="http://evil:8100")),
        "other_base_model": (token_a, _state("node-a", base_model="other-model")),
    }[forge]
    resp = _beat(internal, token, state)
    assert (resp.status_code, resp.json()["code"]) == (status, code)
    assert _snapshot() == before
    assert not Node.objects.filter(name="node-x").exists()


@pytest.mark.parametrize(("field", "value"), [
    ("num_requests_waiting", -1), ("max_loras", 2.5), ("kv_cache_usage_perc", 1.5), ("kv_cache_usage_perc", -0.1),
    ("healthy", "yes"), ("num_preemptions_total", float("nan")), ("num_preemptions_total", -1.0), ("some_new_gauge", -3),
    ("adapters", [{"lora_name": "a--b--1", "lora_int_id": 1, "tier": "gpu-ish"}]),
    ("adapters", [{"lora_name": "../etc", "lora_int_id": 1, "tier": "warm"}]),
    ("adapters", [{"lora_name": "a--b--1", "lora_int_id": 0, "tier": "warm"}]),
    ("adapters", "all of them"),
])
def test_bad_figures_are_refused_and_change_nothing(internal: Client, base_model: Any, field: str,
                                                    value: Any) -> None:
    token = _register("n1")
    assert _beat(internal, token, _state("n1")).status_code == 200
    before = _snapshot()
    body = json.dumps(_state("n1", **{field: value}))  # NaN is written as NaN, which json.loads accepts
    resp = internal.post(URL, data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400 and resp.json()["code"] == "invalid"
    assert field in resp.json()["detail"]
    assert _snapshot() == before


def test_versions_are_recorded_only_under_their_own_name(internal: Client, base_model: Any, make_client: Any) -> None:
    from tests.test_tenant_isolation import _ready_adapter

    _, tenant, _ = make_client()
    version = _ready_adapter(tenant, "bot")
    token = _register("n1")
    entries = [{"lora_name": "someone--else--1", "lora_int_id": version.pk, "tier": "warm"},
               {"lora_name": "x--y--999999", "lora_int_id": 999999, "tier": "warm"}]
    assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    assert not Placement.objects.exists()
    # Copies no version owns are garbage on that node: one pending purge each, however many heartbeats.
    assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    purges = Purge.objects.filter(kind="node", node_id=Node.objects.get(name="n1").pk, done_at=None)
    assert sorted(purges.values_list("lora_name", flat=True)) == ["someone--else--1", "x--y--999999"]
    entries = [{"lora_name": version.served_name, "lora_int_id": version.pk, "tier": "warm"}]
    placement_mark_load_issued(Node.objects.get(name="n1").pk, version.pk)  # the control plane sent it
    assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    assert Placement.objects.get().tier == "warm"


def test_a_report_of_many_made_up_copies_records_a_bounded_number_of_purges(
        internal: Client, base_model: Any, monkeypatch: pytest.MonkeyPatch, django_assert_max_num_queries: Any) -> None:
    """Names no version owns come from the node: one purge row, query and task each made a report of 10,000
    made-up names take 17 s (longer as the rows grew), every heartbeat. Now a few queries and at most
    ``NODE_ORPHANS_PER_REPORT`` new purges per report, and at most ``NODE_PENDING_MAX`` pending on the node."""
    from adapters_app import purge

    monkeypatch.setattr(purge, "NODE_PENDING_MAX", 100, raising=False)
    token = _register("n1")
    entries = [{"lora_name": f"x--y--{i}", "lora_int_id": i + 1, "tier": "hot"} for i in range(2000)]
    with django_assert_max_num_queries(40):
        assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    pending = Purge.objects.filter(kind="node", node_id=Node.objects.get(name="n1").pk, done_at=None)
    assert pending.count() == purge.NODE_ORPHANS_PER_REPORT
    for _ in range(3):
        assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    assert pending.count() == 100 and len(set(pending.values_list("lora_name", flat=True))) == 100


def test_rotation_revokes_the_old_token(internal: Client, base_model: Any) -> None:
    old = _register("n1")
    _, new = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                           base_model_name="tiny-llama", rotate=True)
    assert _beat(internal, old, _state("n1")).status_code == 401
    assert _beat(internal, new.token, _state("n1")).status_code == 200
    assert new.key != node_credentials("n1").key


def test_the_public_listener_has_no_node_or_admin_routes(base_model: Any) -> None:
    token = _register("n1")
    public = Client()
    assert _beat(public, token, _state("n1")).status_code == 404
    assert public.get("/admin/").status_code == 404
    assert not Node.objects.get(name="n1").healthy


def test_register_command_prints_the_node_env(base_model: Any) -> None:
    out = io.StringIO()
    call_command("quiver_node_register", "gpu-7", "--agent-url", "http://gpu-7:8100", "--engine-url",
                 "http://gpu-7:8000", "--base-model", "tiny-llama", stdout=out, stderr=io.StringIO())
    lines = dict(line.split("=", 1) for line in out.getvalue().split())
    creds = node_credentials("gpu-7")
    assert lines == {"QUIVER_NODE_NAME": "gpu-7", "QUIVER_NODE_KEY": creds.key, "QUIVER_NODE_TOKEN": creds.token}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "Bad_Name"}, "lowercase"), ({"agent_url": "ftp://x"}, "agent_url"),
    ({"base_model_name": "nope"}, "Unknown base model"),
])
def test_registration_errors_name_the_field(base_model: Any, kwargs: dict[str, str], message: str) -> None:
    from inference.fleet.nodes import NodeRefused

    args = {"name": "n1", "agent_url": "http://n1:8100", "engine_url": "http://n1:8000",
            "base_model_name": "tiny-llama", **kwargs}
    with pytest.raises(NodeRefused, match=message):
        node_register(**args)


def test_re_registering_for_another_base_model_drops_what_the_node_held(
        internal: Client, base_model: Any, make_client: Any) -> None:
    """The node's placements were for the old model: dropped, and the node is unhealthy until its engine reports
    the new one (a queued warm or a routed request would otherwise send it the old model's adapters)."""
    from adapters_app.services import base_model_register
    from tests.test_tenant_isolation import _ready_adapter

    _, tenant, _ = make_client()
    version = _ready_adapter(tenant, "bot")
    token = _register("n1")
    entries = [{"lora_name": version.served_name, "lora_int_id": version.pk, "tier": "warm"}]
    placement_mark_load_issued(Node.objects.get(name="n1").pk, version.pk)
    assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 200
    assert Placement.objects.filter(node__name="n1", tier="warm").count() == 1
    other = base_model_register(base_model_name="tiny-llama-2", hf_config=base_model.hf_config, max_lora_rank=16)

    node, _ = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                            base_model_name=other.base_model_name)

    assert (node.healthy, node.state, Placement.objects.filter(node=node).count()) == (False, {}, 0)
    assert _beat(internal, token, _state("n1", adapters=entries)).status_code == 409  # still the old model
    assert _beat(internal, token, _state("n1", base_model="tiny-llama-2")).status_code == 200
    assert Node.objects.get(name="n1").healthy
    same, _ = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                            base_model_name="tiny-llama-2")
    assert same.healthy  # the same model again: nothing dropped


# --- Residency claims: a node records only the versions the control plane sent it -----------------------------------


def _entry(version: Any, tier: str = "hot", **extra: Any) -> dict[str, Any]:
    return {"lora_name": version.served_name, "lora_int_id": version.pk, "tier": tier, "served": True, **extra}


def _routes_to(version: Any) -> str | None:
    """The node the gateway's fast path would send ``version``'s requests to (a fresh fleet read), or None."""
    from inference.gateway.directory import load_target
    from inference.gateway.fleet_reader import load_fleet
    from inference.gateway.snapshot import node_choose

    target = load_target(version.tenant_id, version.adapter.name)
    node = node_choose(load_fleet(), target)  # type: ignore[arg-type]
    return node.name if node is not None else None


@pytest.fixture
def two_tenants(make_client: Any, base_model: Any) -> tuple[Any, Any]:
    """(acme's version, victim's version), both ready on ``tiny-llama``."""
    from tests.test_tenant_isolation import _ready_adapter

    _, acme, _ = make_client(slug="acme")
    _, victim, _ = make_client(slug="victim")
    return _ready_adapter(acme, "bot"), _ready_adapter(victim, "secret-bot")


def test_a_forged_claim_of_another_tenants_version_is_not_routed_there(
        internal: Client, two_tenants: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    """Node ``evil`` holds a valid token and reports the victim's version hot, under its real served name: nothing is
    recorded, the victim's requests still go only where the control plane put the version, and the claim is logged
    once however many heartbeats repeat it."""
    import logging

    _, secret = two_tenants
    good, evil = _register("good"), _register("evil")
    placement_mark_load_issued(Node.objects.get(name="good").pk, secret.pk)  # the warm went to "good"
    assert _beat(internal, good, _state("good", adapters=[_entry(secret, "warm")])).status_code == 200
    assert _routes_to(secret) == "good"

    with caplog.at_level(logging.WARNING, logger="inference.fleet.warming"):
        for waiting in (0, 5, 50):  # even once "good" is far busier
            _beat(internal, good, _state("good", adapters=[_entry(secret, "warm")], num_requests_waiting=waiting))
            resp = _beat(internal, evil, _state("evil", adapters=[_entry(secret, "hot", pinned=True)]))
            assert resp.status_code == 200, resp.content
            assert _routes_to(secret) == "good"

    assert not Placement.objects.filter(node__name="evil").exists()
    assert Placement.objects.get(node__name="good").tier == "warm"
    logged = [r for r in caplog.records if r.getMessage() == "node.heartbeat_unasked_version"]
    assert len(logged) == 1
    assert (logged[0].node, logged[0].version_id, logged[0].tenant) == ("evil", secret.pk, "victim")  # type: ignore[attr-defined]


def test_a_claim_counts_once_the_warm_was_issued(internal: Client, two_tenants: tuple[Any, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Unasked, a claim is ignored; once the control plane queued a warm for that node, the same report is recorded
    (and ends the warm); a report arriving while the load call is still running counts too."""
    from inference.fleet.warming import placement_request_warm, placement_warm

    bot, secret = two_tenants
    token = _register("n1")
    node = Node.objects.get(name="n1")
    assert _beat(internal, token, _state("n1", adapters=[_entry(bot)])).status_code == 200
    assert not Placement.objects.exists() and _routes_to(bot) is None

    monkeypatch.setattr("inference.fleet.warming.enqueue_on_commit", lambda *a, **k: None)
    placement_request_warm(bot, node=node)
    assert _beat(internal, token, _state("n1", adapters=[_entry(bot)])).status_code == 200
    row = Placement.objects.get(node=node, adapter_version=bot)
    assert (row.tier, row.served, row.warming_since) == ("hot", True, None)
    assert _routes_to(bot) == "n1"

    def load_then_heartbeat(node_: Any, path: str, payload: dict[str, Any], **_: Any) -> dict[str, Any]:
        # The agent's heartbeat thread reports the new adapter before the load call has answered.
        body = _state("n1", adapters=[_entry(bot), _entry(secret, "warm")])
        assert _beat(internal, token, body).status_code == 200
        assert Placement.objects.get(node=node, adapter_version=secret).tier == "warm"
        return {"tier": "warm", "effect": "changed"}

    monkeypatch.setattr("inference.fleet.warming.node_call", load_then_heartbeat)
    placement_warm(secret, node=Node.objects.get(name="n1"))
    assert _routes_to(secret) == "n1"


def test_evicted_pinned_restarted_and_dead_nodes_keep_what_they_were_sent(
        internal: Client, two_tenants: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every later report of a version the node was sent still counts: an evict, an engine that reloads a name it
    still serves from disk, a pin, a node that stopped heartbeating and came back (rows outlive control-plane
    restarts in PostgreSQL). A deregistered node's rows are gone: what it still holds is ignored after it is
    registered again."""
    from inference.fleet.nodes import node_deregister, node_mark_stale
    from inference.fleet.warming import placement_evict

    bot, _ = two_tenants
    token = _register("n1")
    node = Node.objects.get(name="n1")
    placement_mark_load_issued(node.pk, bot.pk)
    assert _beat(internal, token, _state("n1", adapters=[_entry(bot, "warm")])).status_code == 200

    monkeypatch.setattr("inference.fleet.warming.node_call", lambda *a, **k: {})
    placement_evict(Placement.objects.get(node=node, adapter_version=bot))  # evict now
    _beat(internal, token, _state("n1", adapters=[_entry(bot, "staged", served=False)]))
    assert _routes_to(bot) is None
    _beat(internal, token, _state("n1", adapters=[_entry(bot, "staged")]))  # the name is still served from disk
    assert _routes_to(bot) == "n1"
    VersionIntent.objects.create(adapter_version=bot, pinned_nodes=["n1"])  # an operator pinned it there
    _beat(internal, token, _state("n1", adapters=[_entry(bot, "hot", pinned=True)]))  # reloaded by a request; pinned
    row = Placement.objects.get(node=node, adapter_version=bot)
    assert (row.tier, row.pinned, row.served) == ("hot", True, True)

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert node_mark_stale() == 1 and _routes_to(bot) is None  # the node died
    _beat(internal, token, _state("n1", adapters=[_entry(bot, "hot")]))  # and came back with the version
    assert _routes_to(bot) == "n1"

    node_deregister(node)
    token = _register("n1")
    assert _beat(internal, token, _state("n1", adapters=[_entry(bot, "hot")])).status_code == 200
    assert not Placement.objects.exists() and _routes_to(bot) is None


# --- A node's load answer: its effect verdict binds only itself; its figures are checked (issue 30) ---------------


@pytest.fixture
def loads(internal: Client, two_tenants: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Live nodes ``good``, ``evil`` and ``third``; ``answers[name]`` is what that node's agent answers a load (an
    exception is raised); ``warms`` records the placements a warm was enqueued for, as (node, version id)."""
    from inference.fleet.node_client import NodeCallFailed

    for name in ("good", "evil", "third"):
        assert _beat(internal, _register(name), _state(name)).status_code == 200
    refuse = NodeCallFailed("no_effect", "changes nothing")
    answers: dict[str, Any] = {"good": {"tier": "warm", "effect": "changed"}, "evil": refuse, "third": refuse}
    warms: list[tuple[str, int]] = []

    def answer(node: Any, path: str, payload: dict[str, Any], **_: Any) -> dict[str, Any]:
        reply = answers[node.name]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def enqueued(_name: str, placement_id: int) -> None:
        row = Placement.objects.select_related("node").get(pk=placement_id)
        warms.append((row.node.name, row.adapter_version_id))

    monkeypatch.setattr("inference.fleet.warming.node_call", answer)
    monkeypatch.setattr("inference.fleet.warming.enqueue_on_commit", enqueued)
    return {"answers": answers, "warms": warms, "version": two_tenants[1]}


def _warm(version: Any, name: str) -> str:
    """Warm ``version`` on node ``name``; the agent's refusal code, or ``""`` when it loaded."""
    from inference.fleet.node_client import NodeCallFailed
    from inference.fleet.warming import placement_warm

    try:
        placement_warm(version, node=Node.objects.get(name=name))
    except NodeCallFailed as exc:
        return exc.code
    return ""


def _refused_fleet_wide(version: Any) -> bool:
    from adapters_app.models import AdapterVersion
    from adapters_app.selectors import adapter_version_no_effect_refused

    fresh = AdapterVersion.objects.get(pk=version.pk)
    problems = [p["code"] for p in (fresh.validation_report or {}).get("problems", [])]
    return adapter_version_no_effect_refused(fresh) or "no_effect" in problems


def test_one_nodes_no_effect_refuses_only_that_node_and_an_honest_node_serves_it(
        loads: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """A rogue answering ``no_effect`` refused the version on every node, 503'd its requests and blamed the
    tenant's upload. Now the refusal is the rogue's alone: another node is asked, loads it with effect, serves it,
    and the rogue's word is logged as disputed; the rogue is not sent the version again."""
    import logging

    from inference.fleet.warming import placement_request_warm_enqueued

    version, warms, answers = loads["version"], loads["warms"], loads["answers"]
    answers["third"] = answers["good"]
    with caplog.at_level(logging.WARNING, logger="inference.fleet.warming"):
        assert _warm(version, "evil") == "no_effect"
        assert not _refused_fleet_wide(version)
        second = [node for node, v in warms if v == version.pk]  # the second opinion: one honest node
        assert len(second) == 1 and second[0] != "evil"
        assert _warm(version, second[0]) == ""
    assert not _refused_fleet_wide(version) and _routes_to(version) == second[0]
    disputed = [r for r in caplog.records if r.getMessage() == "placement.no_effect_disputed"]
    assert [r.refused_by for r in disputed] == [["evil"]]  # type: ignore[attr-defined]
    assert placement_request_warm_enqueued(version, node=Node.objects.get(name="evil")) == (
        Placement.objects.get(node__name="evil", adapter_version=version), False)
    caplog.clear()
    last = ({"good", "third"} - set(second)).pop()
    answers[last] = answers["evil"]
    with caplog.at_level(logging.WARNING, logger="inference.fleet.warming"):
        assert _warm(version, last) == "no_effect"  # against a node that found an effect: its own refusal only
    assert not _refused_fleet_wide(version) and _routes_to(version) == second[0]
    assert [r.getMessage() for r in caplog.records if "no_effect" in r.getMessage()] == ["placement.no_effect_disputed"]


def test_an_inert_adapter_is_refused_fleet_wide_once_a_second_node_agrees(loads: dict[str, Any]) -> None:
    """The honest case: an adapter that changes nothing is refused by the first node, a second one is asked and
    agrees, and from then on it is refused everywhere (its report says why) without loading it on every node."""
    from inference.fleet.warming import placement_request_warm_enqueued

    version, warms = loads["version"], loads["warms"]
    loads["answers"]["good"] = loads["answers"]["evil"]
    assert _warm(version, "third") == "no_effect" and not _refused_fleet_wide(version)
    second = [node for node, v in warms if v == version.pk]
    assert len(second) == 1 and second[0] != "third"
    assert _warm(version, second[0]) == "no_effect"
    assert _refused_fleet_wide(version)
    last = ({"good", "evil", "third"} - {"third", second[0]}).pop()
    fresh = type(version).objects.get(pk=version.pk)  # as the reconciler and the gateway read it
    _, enqueued = placement_request_warm_enqueued(fresh, node=Node.objects.get(name=last))
    assert not enqueued and len(warms) == 1
    assert Placement.objects.get(node__name=last, adapter_version=version).last_error.startswith("no_effect")


def test_the_only_node_able_to_load_a_version_refuses_it_alone(loads: dict[str, Any]) -> None:
    """With one node registered for the base model, its probe is the only one there is: refused at once."""
    version = loads["version"]
    Node.objects.exclude(name="evil").delete()
    assert _warm(version, "evil") == "no_effect"
    assert _refused_fleet_wide(version) and loads["warms"] == []


@pytest.mark.parametrize(("answer", "tier", "load_ms", "clamped"), [
    ({"tier": "hot", "load_ms": 12.5, "effect": "changed"}, "hot", 12.5, []),
    ({"tier": "bogus", "load_ms": 3}, "warm", 3.0, ["tier"]),
    ({"tier": "errored"}, "warm", None, ["tier"]),
    ({"load_ms": "soon"}, "warm", None, ["load_ms"]),
    ({"load_ms": -1e308}, "warm", None, ["load_ms"]),
    ({"load_ms": float("inf")}, "warm", None, ["load_ms"]),
    ({"load_ms": float("nan")}, "warm", None, ["load_ms"]),
    ({"load_ms": 10**400}, "warm", None, ["load_ms"]),
    ({"load_ms": True, "pinned": "yes", "effect": "great"}, "warm", None, ["load_ms", "effect", "pinned"]),
    (["not", "an", "object"], "warm", None, ["answer"]),
])
def test_a_load_answer_is_stored_only_as_an_agent_can_give_it(
        loads: dict[str, Any], caplog: pytest.LogCaptureFixture, answer: Any, tier: str, load_ms: float | None,
        clamped: list[str]) -> None:
    """A node's load answer was stored unchecked (``tier`` "bogus", ``load_ms`` -1e308) or failed the warm task
    (``load_ms`` "soon": ValueError). Each figure is kept only when valid, else replaced and logged."""
    import logging

    version = loads["version"]
    loads["answers"]["good"] = answer
    with caplog.at_level(logging.WARNING, logger="inference.fleet.load_answers"):
        assert _warm(version, "good") == ""
    row = Placement.objects.get(node__name="good", adapter_version=version)
    assert (row.tier, row.load_ms, row.served, row.pinned) == (tier, load_ms, True, False)
    logged = [r for r in caplog.records if r.getMessage() == "placement.load_answer_clamped"]
    assert [r.fields for r in logged] == ([clamped] if clamped else [])  # type: ignore[attr-defined]


def test_a_node_serving_a_version_it_says_changes_nothing_is_not_believed(
        loads: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """An agent refuses a load whose probe finds no effect unless validation expected none; one that serves it and
    says ``no_effect`` contradicts itself: logged, and the tenant's report is left as it was."""
    import logging

    version = loads["version"]
    loads["answers"]["good"] = {"tier": "warm", "effect": "no_effect"}
    with caplog.at_level(logging.WARNING, logger="inference.fleet.warming"):
        assert _warm(version, "good") == ""
    assert not _refused_fleet_wide(version)
    assert "effect_probe" not in (type(version).objects.get(pk=version.pk).validation_report or {})
    assert [r.getMessage() for r in caplog.records] == ["placement.effect_answer_inconsistent"]
