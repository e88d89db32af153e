"""Hostile heartbeats from a node holding a valid token: wrong types, figures past the database's range, deep JSON.

Each is a 400 naming the field (never a 500) and changes nothing.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from inference.fleet.models import Node
from inference.fleet.nodes import node_register

pytestmark = pytest.mark.django_db
URL = "/internal/v1/nodes/heartbeat"


@pytest.fixture
def token(base_model: Any) -> str:
    _, creds = node_register(name="n1", agent_url="http://n1:8100", engine_url="http://n1:8000",
                             base_model_name="tiny-llama")
    return creds.token


@pytest.fixture
def internal() -> Any:
    with override_settings(ROOT_URLCONF="config.internal_urls"):
        yield Client(raise_request_exception=False)


@pytest.mark.parametrize(("extra", "field"), [
    ({"agent_url": 5}, "agent_url"),
    ({"engine_url": ["http://evil:8000"]}, "engine_url"),
    ({"base_model": {"name": "tiny-llama"}}, "base_model"),
    ({"max_loras": 10**30}, "max_loras"),
    ({"num_requests_running": 2**63}, "num_requests_running"),
    ({"max_lora_rank": 2**31}, "max_lora_rank"),
    ({"adapters": [{"lora_name": "x", "lora_int_id": 2**63, "tier": "hot"}]}, "lora_int_id"),  # was a 500
    # The agent's residency summary: NaN or an infinity anywhere failed the jsonb write (a 500); the others were
    # stored and crashed the reconciler's int() (fleet_reconcile._hot_bytes) or skewed a tenant's GPU bytes.
    ({"residency": {"move_seconds": float("nan")}}, "residency.move_seconds"),
    ({"residency": {"move_seconds": float("inf")}}, "residency.move_seconds"),
    ({"residency": {"move_seconds": -1.0}}, "residency.move_seconds"),
    ({"residency": {"gpu": float("nan")}}, "residency.gpu"),
    ({"residency": {"gpu_slot_bytes": "lots"}}, "residency.gpu_slot_bytes"),
    ({"residency": {"gpu_slot_bytes": -10**18}}, "residency.gpu_slot_bytes"),
    ({"residency": {"gpu_slot_bytes": 2**64}}, "residency.gpu_slot_bytes"),
    ({"residency": "not an object"}, "residency"),
    ({"adapters": [{"lora_name": "x", "lora_int_id": 1, "tier": "hot", "extra": {"x": [float("-inf")]}}]},
     "adapters[0].extra.x[0]"),
])
def test_bad_field_is_a_400_naming_it_and_changes_nothing(internal: Client, token: str, extra: dict[str, Any],
                                                          field: str) -> None:
    before = list(Node.objects.values())
    resp = internal.post(URL, data=json.dumps({"node": "n1", "healthy": True, **extra}),
                         content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 400, resp.content
    assert resp.json()["code"] == "invalid" and field in resp.json()["detail"]
    assert list(Node.objects.values()) == before


def test_the_agents_own_residency_summary_is_accepted(internal: Client, token: str) -> None:
    from inference.node.state_report import residency_summary

    adapters = [{"lora_name": "acme--a--1", "lora_int_id": 1, "tier": "hot", "pinned": True, "served": True}]
    engine = {"slot_bytes": 4096, "bytes": {"1": 2048}, "loads_total": 3,
              "moves": {"disk_to_cpu_s": 0.0125, "cpu_to_gpu_s": 0.001}}
    for summary in (residency_summary(adapters, engine, 1 << 20), residency_summary(adapters, None, 0)):
        resp = internal.post(URL, data=json.dumps({"node": "n1", "healthy": True, "residency": summary}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert resp.status_code == 200, resp.content
        assert Node.objects.get(name="n1").state["residency"] == summary


@pytest.mark.parametrize("auth", ["valid", "bogus"])
def test_deeply_nested_json_is_a_400(internal: Client, token: str, auth: str) -> None:
    header = f"Bearer {token}" if auth == "valid" else "Bearer qvn_n1.forged"
    resp = internal.post(URL, data=b"[" * 100_000 + b"]" * 100_000, content_type="application/json",
                         HTTP_AUTHORIZATION=header)
    assert resp.status_code == (400 if auth == "valid" else 401), resp.content


def test_the_answer_names_the_reported_adapters_the_plan_puts_on_other_nodes_only(internal: Client,
                                                                                  token: str) -> None:
    """Only versions reported under their served name (the node was sent them): a stolen node token listing bare
    version ids, or a version under another name, learns nothing of the plan (attack round)."""
    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_create
    from common.redis import sync_client
    from inference.fleet.plan import plan_key, plan_publish
    from tests.factories import TenantFactory
    from tests.fixtures.fleet_plan import plan_forget

    tenant = TenantFactory(slug="acme")
    adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    v = [AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=n, sha256=f"{n}" * 64, size_bytes=10,
                                       s3_prefix=f"p{n}/", files=[], status="ready", r=8) for n in range(1, 6)]
    adapters = [{"lora_name": x.served_name, "lora_int_id": x.pk, "tier": "warm", "pinned": False, "served": True}
                for x in v[:4]]
    adapters.append({"lora_name": "acme--guess--1", "lora_int_id": v[4].pk, "tier": "warm", "pinned": False,
                     "served": True})  # planned elsewhere, but not under its name: the node was never sent it
    try:
        # v[3]: not planned (new, or the plan is older)
        plan_publish({v[0].pk: ("n2",), v[1].pk: ("n1",), v[2].pk: ("n2", "n1"), v[4].pk: ("n2",)})
        resp = internal.post(URL, data=json.dumps({"node": "n1", "healthy": True, "adapters": adapters}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    finally:
        sync_client().delete(plan_key())  # type: ignore[union-attr]
        plan_forget()
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"node": "n1", "healthy": True, "elsewhere": [v[0].pk], "over_quota": []}


def test_the_answer_names_the_reported_adapters_of_tenants_at_their_gpu_quota(internal: Client, token: str) -> None:
    """The node evicts those first (``inference.policy.node_eviction``): tenant A holds two GPU slots against a
    quota of one, so its resident versions are named, B's (under its quota) and unreported ones are not."""
    from adapters_app.models import AdapterVersion
    from adapters_app.services import adapter_create
    from inference.fleet.models import Placement, TenantResidencyQuota
    from tests.factories import TenantFactory

    node = Node.objects.get(name="n1")
    Node.objects.filter(pk=node.pk).update(state={"residency": {"gpu_slot_bytes": 1000}})
    versions = {}
    for slug in ("a", "b"):
        tenant = TenantFactory(slug=slug)
        adapter = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
        versions[slug] = [AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=n, sha256=f"{n}" * 64,
                                                        size_bytes=10, s3_prefix=f"{slug}{n}/", files=[],
                                                        status="ready", r=8) for n in (1, 2, 3)]
        for v in versions[slug][:2]:
            Placement.objects.create(node=node, adapter_version=v, tier="hot", served=True,
                                     load_issued_at=timezone.now())
        TenantResidencyQuota.objects.create(tenant=tenant, max_gpu_bytes=1000 if slug == "a" else 5000)
    reported = [v for slug in ("a", "b") for v in versions[slug][1:]]
    adapters = [{"lora_name": v.served_name, "lora_int_id": v.pk, "tier": "hot", "pinned": False, "served": True}
                for v in reported]
    # A's first version by a bare id under another name: not named (the node was never sent it).
    adapters.append({"lora_name": "a--guess--1", "lora_int_id": versions["a"][0].pk, "tier": "hot", "pinned": False,
                     "served": True})

    body = {"node": "n1", "healthy": True, "adapters": adapters, "residency": {"gpu_slot_bytes": 1000}}
    resp = internal.post(URL, data=json.dumps(body), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {token}")

    assert resp.status_code == 200, resp.content
    assert resp.json()["over_quota"] == [versions["a"][1].pk, versions["a"][2].pk]


def test_heartbeats_closer_than_the_floor_are_refused_before_any_work(internal: Client, token: str) -> None:
    """A stolen heartbeat token flooded the listener (10,000-adapter and 3.9 MB reports in four loops), slowing
    every node's accepts; a node's heartbeats closer together than QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S are refused
    (429, nothing written) before validation (attack round)."""
    def beat(**extra: Any) -> Any:
        return internal.post(URL, data=json.dumps({"node": "n1", "healthy": True, **extra}),
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")

    with override_settings(QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S=60):
        assert beat().status_code == 200  # the first one of the node
        seen = Node.objects.get(name="n1").last_heartbeat_at
        flood = beat(num_requests_running=3)
        assert (flood.status_code, flood.json()["code"]) == (429, "heartbeat_too_soon"), flood.content
        node = Node.objects.get(name="n1")
        assert (node.last_heartbeat_at, node.num_requests_running) == (seen, None)  # nothing recorded
        Node.objects.filter(name="n1").update(last_heartbeat_at=timezone.now() - timedelta(seconds=61))
        assert beat(num_requests_running=3).status_code == 200  # a beat past the floor is taken as ever
    assert Node.objects.get(name="n1").num_requests_running == 3


@pytest.mark.parametrize("case", ["bogus token", "too soon"])
def test_a_refused_heartbeat_body_is_never_parsed(internal: Client, token: str, case: str) -> None:
    """The view parsed up to 4 MB of JSON before checking the token or the floor: over a second of the internal
    listener's CPU per refused request (attack round)."""
    from unittest import mock

    from inference.fleet import internal_views

    if case == "too soon":
        ok = internal.post(URL, data=json.dumps({"node": "n1", "healthy": True}), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")
        assert ok.status_code == 200, ok.content
    body = json.dumps({"node": "n1", "healthy": True, "marker": "parse-me-not"}).encode()
    real_loads, parsed = json.loads, []

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text == body)  # the database's JSON fields are decoded with json.loads too
        return real_loads(text, *args, **kwargs)

    with mock.patch.object(internal_views.json, "loads", side_effect=loads), \
            override_settings(QUIVER_NODE_HEARTBEAT_MIN_INTERVAL_S=60):
        resp = internal.post(URL, data=body, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {'qvn_n1.bogus' if case == 'bogus token' else token}")
    assert resp.status_code == (401 if case == "bogus token" else 429), resp.content
    assert not any(parsed)
