"""Fleet residency on a real node: the session's vLLM CPU engine, its node agent (heartbeat every second), a real
Celery worker, the gateway, PostgreSQL, Redis and S3.

Engine loads are the engine's own count (``inference.node.worker_ext``: calls of vLLM's ``_load_adapter`` per
``lora_int_id``), read from the agent's state report; residency is the engine's own lists (``/quiver/v1/loras``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from adapters_app.models import AdapterVersion
from demo.api_client import upload_adapter, wait_validated
from inference.fleet.models import FleetAuditRecord, Node, Placement, VersionIntent
from inference.fleet.node_client import node_call
from inference.fleet.node_keys import node_credentials
from inference.fleet.reconcile import fleet_reconcile
from inference.fleet.services import (
    FleetActionError,
    node_pins,
    placement_evict_now,
    tenant_residency_quota_set,
    version_pin,
    version_replicas_set,
    version_unpin,
)
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)
HEARTBEAT_S = 1.0  # tests.fixtures.stack.node_agent


def _wait(what: str, check: Callable[[], Any], timeout: float = 90.0, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def _agent_state(agent: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {node_credentials(agent.node_name).key}"}
    return httpx.get(agent.url + "/v1/state", headers=headers, timeout=60).json()


def _engine_lists(agent: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {node_credentials(agent.node_name).key}"}
    return httpx.get(agent.engine_url + "/quiver/v1/loras", headers=headers, timeout=60).json()


def _loads(agent: Any, lora_int_id: int) -> int:
    residency = _engine_lists(agent)["residency"]
    return int(residency["loads"].get(str(lora_int_id), 0))


def _entry(agent: Any, version: AdapterVersion) -> dict[str, Any] | None:
    return next((a for a in _agent_state(agent)["adapters"] if a["lora_int_id"] == version.pk), None)


def _served(agent: Any, version: AdapterVersion) -> bool:
    entry = _entry(agent, version)
    return bool(entry and entry["served"] and entry["tier"] in ("hot", "warm"))


def _ready(api: httpx.Client, tenant: Any, name: str, folder: Path) -> AdapterVersion:
    number = upload_adapter(api, name, folder, base_model="tiny-llama")["number"]
    assert wait_validated(api, name, number, timeout=180)["status"] == "ready"
    return AdapterVersion.objects.select_related("adapter__tenant", "adapter__base_model").get(
        adapter__tenant=tenant, adapter__name=name, number=number)


@pytest.fixture
def tenant_api(gateway_server: str) -> tuple[Any, httpx.Client]:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="app")
    return tenant, httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=300)


def _complete(api: httpx.Client, model: str, *, attempts: int = 20) -> httpx.Response:
    """One completion; admission's 429 (busy engine) and a warm still loading are retried, as a client would."""
    for _ in range(attempts):
        resp = api.post("/v1/completions", json={"model": model, "prompt": "the cat", "max_tokens": 2,
                                                 "temperature": 0})
        code = resp.json().get("error", {}).get("code") if resp.status_code >= 400 else None
        if resp.status_code == 429 or code == "adapter_warm_timeout":
            time.sleep(float(resp.headers.get("Retry-After", "1")))
            continue
        return resp
    return resp


def _make_cold(node: Node, agent: Any, version: AdapterVersion) -> None:
    """Off the node entirely (engine and disk) and no placement row: only S3 holds it."""
    _wait("the warm after validation", lambda: _served(agent, version))
    node_call(node, "/v1/adapters/unload", {"lora_name": version.served_name, "purge": True})
    _wait("the node to stop reporting it", lambda: _entry(agent, version) is None, timeout=30)
    Placement.objects.filter(adapter_version=version).delete()


def test_fifty_concurrent_first_requests_make_one_engine_load(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "burst", demo_assets.adapters["capitals"])
    _make_cold(live_node, node_agent, version)
    before = _loads(node_agent, version.pk)

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda _: _complete(api, "burst"), range(50)))

    assert [a.status_code for a in answers] == [200] * 50, [a.text for a in answers if a.status_code != 200][:3]
    assert _loads(node_agent, version.pk) - before == 1  # one engine load for all 50
    assert Placement.objects.filter(adapter_version=version).count() == 1


def test_evict_now_takes_effect_within_a_heartbeat_and_the_next_request_reloads(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "evictme", demo_assets.adapters["sums"])
    assert _complete(api, "evictme").status_code == 200
    placement = Placement.objects.get(adapter_version=version, node=live_node)
    before = _loads(node_agent, version.pk)

    asked = time.monotonic()
    placement_evict_now(placement, actor="ops@test")  # outside a transaction: the task is sent at once
    _wait("the engine to drop it", lambda: not _served(node_agent, version), timeout=60, poll=0.05)
    took = time.monotonic() - asked
    assert version.pk not in _engine_lists(node_agent)["residency"]["cpu"]
    assert took <= 30.0, f"evict took {took:.1f} s"  # a task, not the next reconcile; slack for a loaded CI box

    # The control plane hears it from the node's next heartbeat (the one in flight may predate the drop). Only a
    # heartbeat recorded after the drop counts: the last one before it may predate the warm and not list it either.
    dropped_at = timezone.now()
    beats: set[Any] = set()

    def heartbeat_says_gone() -> bool:
        node = Node.objects.get(pk=live_node.pk)
        if node.last_heartbeat_at <= dropped_at:
            return False
        beats.add(node.last_heartbeat_at)
        return not any(a["lora_int_id"] == version.pk and a.get("served") for a in node.state["adapters"])

    _wait("a heartbeat without it", heartbeat_says_gone, timeout=30, poll=0.05)
    # The heartbeats run one at a time (read the state, post it, sleep): recorded after the drop, at most the one whose
    # state was read before it, then the first read after it, which must report it.
    assert len(beats) <= 2, f"{len(beats) - 1} heartbeats came before one reported the eviction"
    _wait("the evict's audit outcome", lambda: FleetAuditRecord.objects.get(action="evict").after.get("outcome")
          == "evicted", timeout=30, poll=0.05)
    assert FleetAuditRecord.objects.get(action="evict").after["tier"] == "staged"
    row = Placement.objects.get(pk=placement.pk)
    assert (row.tier, row.served) == ("staged", False)

    assert _complete(api, "evictme").status_code == 200
    assert _loads(node_agent, version.pk) - before == 1  # the next request loaded it again


def test_a_pin_survives_eviction_pressure(
    demo_assets: Any, tiny_adapters: dict[str, Path], base_model: Any, celery_worker: None, node_agent: Any,
    live_node: Node, tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "pinned", demo_assets.adapters["upper"])
    _wait("the warm", lambda: _served(node_agent, version))
    version_pin(version, node=live_node, actor="ops@test")
    _wait("the engine's pin", lambda: (_entry(node_agent, version) or {}).get("pinned"), timeout=60)
    loads_before = _loads(node_agent, version.pk)

    # Pressure: a full CPU cache's worth of the tenant's other adapters and one more, each loaded onto the node by
    # its warm after validation, so 6 adapters pass through 4 CPU slots and every unpinned one can be a victim.
    capacity = live_node.max_cpu_loras
    fillers = []
    for i in range(capacity + 1):  # one at a time: each warm (load + effect probe) ends before the next starts
        fillers.append(_ready(api, tenant, f"filler-{i}", tiny_adapters["qv-r8"]))
        _wait("the filler's engine load", lambda: _served(node_agent, fillers[-1]), timeout=120)

    engine = _engine_lists(node_agent)["residency"]
    assert version.pk in engine["cpu"] and version.pk in engine["pinned"]  # vLLM's own lists
    assert [f.pk for f in fillers if f.pk not in engine["cpu"]]  # fillers were evicted: the pressure was real
    assert _loads(node_agent, version.pk) == loads_before  # never evicted, so never reloaded
    assert _complete(api, "pinned").status_code == 200


def test_tenant_residency_quotas_are_enforced(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    first = _ready(api, tenant, "quota-a", demo_assets.adapters["capitals"])
    second = _ready(api, tenant, "quota-b", demo_assets.adapters["sums"])
    for version in (first, second):
        assert _complete(api, version.adapter.name).status_code == 200
    tenant_residency_quota_set(tenant, max_pinned=1, max_gpu_bytes=None, actor="ops@test")
    version_pin(first, node=live_node, actor="ops@test")
    _wait("the engine's pin", lambda: (_entry(node_agent, first) or {}).get("pinned"), timeout=60)
    with pytest.raises(FleetActionError) as refused:
        version_pin(second, node=live_node, actor="ops@test")
    assert refused.value.code == "residency_quota_exceeded"

    # GPU bytes: no room at all for unpinned GPU residents; the reconciler evicts this tenant's own.
    tenant_residency_quota_set(tenant, max_pinned=1, max_gpu_bytes=0, actor="ops@test")

    def second_on_gpu() -> bool:
        assert _complete(api, "quota-b").status_code == 200  # a request puts it in a GPU slot
        return Placement.objects.filter(adapter_version=second, node=live_node, tier="hot").exists()

    _wait("a heartbeat showing quota-b on GPU", second_on_gpu, timeout=60, poll=HEARTBEAT_S)
    fleet_reconcile()
    _wait("the engine to drop the over-quota adapter", lambda: not _served(node_agent, second), timeout=60)
    assert (_entry(node_agent, first) or {}).get("pinned")  # pins are never trimmed
    # The database follows the engine by heartbeats: wait for one built after the drop (recorded more than an
    # interval later; the agent sends one at a time), or a report from before the drop can still show it resident
    # and the next pass would rightly evict it again (a whole-suite run on a busy machine).
    dropped = timezone.now()
    _wait("a heartbeat built after the drop", lambda: (Node.objects.get(pk=live_node.pk).last_heartbeat_at or dropped)
          > dropped + timedelta(seconds=HEARTBEAT_S), timeout=30, poll=0.05)
    # And the plan does not warm it back while the tenant has no GPU room: the pass asks for nothing (a warm is the
    # only way back without a request), and a heartbeat recorded after that pass still shows it out of the engine.
    passed = timezone.now()
    assert fleet_reconcile() == 0
    _wait("a heartbeat after the pass", lambda: (Node.objects.get(pk=live_node.pk).last_heartbeat_at or passed) > passed,
          timeout=30, poll=0.05)
    assert not _served(node_agent, second)


def test_reconciler_converges_after_a_control_plane_restart(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client], settings: Any,
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "restart", demo_assets.adapters["capitals"])
    _make_cold(live_node, node_agent, version)
    version_replicas_set(version, min_replicas=1, max_replicas=1, actor="ops@test")
    # A warm was asked for, then the control plane died before any worker ran it: the row says "warming".
    stale = 2 * settings.QUIVER_WARM_WAIT_S
    Placement.objects.create(node=live_node, adapter_version=version, tier="cold",
                             warming_since=time_ago(stale))

    fleet_reconcile()  # the first pass after the restart re-sends the lost warm
    _wait("the version to be resident again", lambda: _served(node_agent, version), timeout=120)
    _wait("the heartbeat to record it", lambda: Placement.objects.filter(
        adapter_version=version, tier__in=["hot", "warm"], warming_since=None).exists(), timeout=30)
    loads = _loads(node_agent, version.pk)
    assert fleet_reconcile() == 0 and fleet_reconcile() == 0  # converged: nothing more, however often it runs
    assert _loads(node_agent, version.pk) == loads


def time_ago(seconds: float) -> Any:
    from datetime import timedelta

    return timezone.now() - timedelta(seconds=seconds)


def test_the_residency_a_node_reports_is_the_engines_own(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    for name in ("res-a", "res-b", "res-c"):
        _ready(api, tenant, name, demo_assets.adapters["capitals"])
        assert _complete(api, name).status_code == 200
    engine = _engine_lists(node_agent)
    gpu, cpu = set(engine["residency"]["gpu"]), set(engine["residency"]["cpu"])

    def heartbeat_matches() -> bool:
        reported = {a["lora_int_id"]: a["tier"] for a in Node.objects.get(pk=live_node.pk).state["adapters"]
                    if a.get("served")}
        engine_now = _engine_lists(node_agent)["residency"]
        if set(engine_now["gpu"]) != gpu or set(engine_now["cpu"]) != cpu:
            return False  # the engine moved on (another request); compare again
        hot = {i for i, t in reported.items() if t == "hot"}
        warm = {i for i, t in reported.items() if t == "warm"}
        return hot == gpu and warm == cpu - gpu

    _wait("the heartbeat's residency to equal the engine's lists", heartbeat_matches, timeout=30)
    assert len(gpu) <= live_node.max_loras and gpu <= cpu


def test_the_effect_probe_flags_an_adapter_that_does_nothing(
    no_effect_adapters: dict[str, Path], base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    tenant, api = tenant_api
    version = _ready(api, tenant, "noop", no_effect_adapters["cancel"])  # validation cannot see it

    report = _wait("the probe's verdict", lambda: (AdapterVersion.objects.get(pk=version.pk).validation_report or {})
                   .get("effect_probe"), timeout=120)
    assert report == {"verdict": "no_effect", "served": False}
    shown = api.get("/api/v1/adapters/noop/versions/1").json()["validation_report"]
    assert [p["severity"] for p in shown["problems"] if p["code"] == "no_effect"] == ["error"]
    answer = api.post("/v1/completions", json={"model": "noop", "prompt": "the cat", "max_tokens": 2})
    assert answer.status_code == 503 and "no_effect" in answer.json()["error"]["message"]
    assert not _served(node_agent, version)  # never served as the base model in silence

    # PEFT's untouched init (every lora_B zero): validation warned, so it is served and the report says why.
    untrained = _ready(api, tenant, "untrained", no_effect_adapters["zero_b"])
    _wait("the untrained version's verdict", lambda: (AdapterVersion.objects.get(pk=untrained.pk).validation_report
                                                      or {}).get("effect_probe"), timeout=120)
    assert _complete(api, "untrained").status_code == 200


def _hints(agent: Any) -> dict[str, list[int]]:
    return _engine_lists(agent)["residency"]["eviction"]["hints"]


def test_pressure_on_the_node_evicts_the_over_quota_tenants_adapter_never_the_other_tenants(
    tiny_adapters: dict[str, Path], base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    gateway_server: str, tenant_api: tuple[Any, httpx.Client],
) -> None:
    """Tenant A's adapter is the most used on the node, and A is over its GPU quota; B is under its own. A full CPU
    cache takes one more of B's: the node evicts A's (LFU alone would drop one of B's, each used once)."""
    a, a_api = tenant_api
    b: Any = TenantFactory()
    _, key = api_key_create(b, name="app")
    b_api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    tenant_residency_quota_set(b, max_pinned=None, max_gpu_bytes=10**12, actor="ops@test")
    capacity = live_node.max_cpu_loras
    hot = _ready(a_api, a, "a-hot", tiny_adapters["qv-r8"])
    _wait("A's engine load", lambda: _served(node_agent, hot), timeout=120)
    theirs = []
    for i in range(capacity - 1):  # one at a time: each warm (load + effect probe) ends before the next starts
        theirs.append(_ready(b_api, b, f"b-{i}", tiny_adapters["qv-r8"]))
        _wait("B's engine load", lambda: _served(node_agent, theirs[-1]), timeout=120)
    for _ in range(4):
        assert _complete(a_api, "a-hot").status_code == 200
    assert set(_engine_lists(node_agent)["residency"]["cpu"]) >= {hot.pk, *(v.pk for v in theirs)}

    tenant_residency_quota_set(a, max_pinned=None, max_gpu_bytes=0, actor="ops@test")
    # The control plane names A's adapter in its heartbeat answer; the agent relays it to the engine's workers.
    _wait("the node to rank by A's quota", lambda: hot.pk in _hints(node_agent)["over_quota"], timeout=30, poll=0.05)
    assert not set(_hints(node_agent)["over_quota"]) & {v.pk for v in theirs}
    theirs.append(_ready(b_api, b, "b-new", tiny_adapters["qv-r8"]))  # the pressure: its warm needs a CPU slot
    _wait("B's new engine load", lambda: _served(node_agent, theirs[-1]), timeout=120)

    cpu = set(_engine_lists(node_agent)["residency"]["cpu"])
    assert hot.pk not in cpu  # A lost its own adapter
    assert {v.pk for v in theirs} <= cpu  # and B lost none
    assert _complete(b_api, "b-0").status_code == 200


def test_twenty_concurrent_pins_at_the_node_leave_slots_minus_one_in_the_database_and_the_engine(
    demo_assets: Any, base_model: Any, celery_worker: None, node_agent: Any, live_node: Node,
    tenant_api: tuple[Any, httpx.Client],
) -> None:
    from adapters_app.services import adapter_create

    tenant, api = tenant_api
    source = _ready(api, tenant, "pin-src", demo_assets.adapters["upper"])
    # Pins left in the shared engine by earlier tests are orphans once their rows are gone: the node drops them.
    _wait("no pin left in the engine", lambda: not _engine_lists(node_agent)["residency"]["pinned"], timeout=90)
    versions = []
    for i in range(20):  # the same S3 files behind 20 adapters: no upload or validation each
        clone = AdapterVersion.objects.get(pk=source.pk)
        clone.pk = None
        clone.adapter = adapter_create(tenant, name=f"pin-{i}", base_model_name="tiny-llama")
        clone.save()
        versions.append(clone)
    outcomes: Counter[str] = Counter()
    start, lock = threading.Barrier(len(versions)), threading.Lock()

    def pin(version: AdapterVersion) -> None:
        try:
            start.wait()
            version_pin(version, node=live_node, actor="ops@test")
            outcome = "pinned"
        except FleetActionError as exc:
            outcome = exc.code
        finally:
            connection.close()
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=pin, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    bound = live_node.max_loras - 1
    assert outcomes == Counter({"pinned": bound, "pin_limit": 20 - bound})
    # A refused pin rolls back whole: its version has no intent row at all.
    [winner] = [v for v in versions if live_node.name in getattr(
        VersionIntent.objects.filter(adapter_version=v).first(), "pinned_nodes", [])]
    _wait("the engine's pin", lambda: (_entry(node_agent, winner) or {}).get("pinned"), timeout=120)
    engine = _engine_lists(node_agent)["residency"]
    assert set(engine["pinned"]) == {winner.pk}
    assert node_pins(live_node) == {winner.pk}
    # The row's mark follows the node's reports: a heartbeat built before the pinned load reached the engine drops
    # the row (and its mark) until the next one reports it pinned (CI: 0 for one heartbeat), so wait a few.
    _wait("the pin in the database", lambda: Placement.objects.filter(node=live_node, pinned=True).count() == bound,
          timeout=30)
    assert Placement.objects.filter(node=live_node, pinned=True).count() == bound
    # Leave the shared engine without a pinned adapter.
    version_unpin(winner, node=live_node, actor="ops@test")
    _wait("the unpin", lambda: not _engine_lists(node_agent)["residency"]["pinned"], timeout=60)
