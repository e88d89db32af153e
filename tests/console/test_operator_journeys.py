"""Operator journeys in a real browser against the real stack with a live vLLM node: the residency map follows
pin and evict through the engine's own heartbeats, a limit lowered in the console is enforced by the gateway, and a
non-staff user gets a clear page instead of 403s. Screenshots go to ``conftest.SHOTS``."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from demo.assets import DemoAssets
from inference.fleet.models import FleetAuditRecord, Node, Placement
from inference.metering.models import UsageRecord
from tests.console.conftest import login, screenshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _tenant_api(gateway_server: str, slug: str) -> tuple[Any, httpx.Client]:
    from tenants.services import api_key_create

    tenant = TenantFactory(slug=slug, name=slug.title())
    _, key = api_key_create(tenant, name="setup")
    return tenant, httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_operator_evicts_and_pins_and_the_residency_map_follows_the_engine(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None, live_node: Any,
    gateway_server: str, clean_vllm_engine: Any,
) -> None:
    from demo.api_client import upload_adapter, wait_validated

    tenant, api = _tenant_api(gateway_server, "acme")
    number = upload_adapter(api, "capitals", demo_assets.adapters["capitals"], base_model="tiny-llama")["number"]
    assert wait_validated(api, "capitals", number)["status"] == "ready"
    # A ready version is warmed onto the live node by a worker; the node's heartbeat then reports its tier.
    _wait(lambda: Placement.objects.filter(node=live_node, tier__in=["hot", "warm"]).exists(), 120, "the warm")
    make_user("operator", staff=True)
    page = console()
    login(page, "operator")
    page.get_by_role("link", name="Residency map").click()
    label = f"acme/capitals v{number}"
    cell = page.get_by_test_id(f"cell-{label}-{live_node.name}")
    expect(cell).to_have_attribute("aria-label", re.compile(r": (LoRA slot|CPU cache)$"), timeout=30_000)
    screenshot(page, "operator-residency-before")
    page.get_by_role("button", name=f"evict {label} on {live_node.name}").click()
    page.get_by_role("button", name="Confirm evict").click()
    # Out of the engine: the node keeps the files on disk, and says so in its next heartbeat.
    expect(cell).to_have_attribute("aria-label", re.compile(r": disk$"), timeout=60_000)
    page.get_by_role("button", name=f"pin {label} on {live_node.name}").click()
    page.get_by_role("button", name="Confirm pin").click()
    expect(cell).to_have_attribute("aria-label", re.compile(r": (LoRA slot|CPU cache), pinned$"), timeout=60_000)
    screenshot(page, "operator-residency-after")
    # The cell may show the pin task's answer while a heartbeat sent before the pin is still being written (it
    # reports the row unpinned for a moment): wait for the row, as for the engine's own figures below.
    def pinned_row() -> bool:
        row = Placement.objects.get(node=live_node, adapter_version__adapter__name="capitals")
        return row.pinned and row.tier in ("hot", "warm")

    _wait(pinned_row, 30, "the pinned placement row")
    # The engine itself reports the pin, in the next heartbeat (the cell may show the pin task's answer first).
    _wait(lambda: Node.objects.get(pk=live_node.pk).state.get("residency", {}).get("pinned", 0) >= 1, 30,
          "the engine's own pin in a heartbeat")
    assert list(FleetAuditRecord.objects.order_by("id").values_list("action", flat=True)) == ["evict", "pin"]
    # Leave the shared engine without a pinned adapter.
    page.get_by_role("button", name=f"unpin {label} on {live_node.name}").click()
    page.get_by_role("button", name="Confirm unpin").click()
    expect(cell).to_have_attribute("aria-label", re.compile(r": (disk|CPU cache|LoRA slot)$"), timeout=60_000)


def test_operator_lowers_a_tenants_rpm_and_the_gateway_answers_429(
    console: Any, make_user: Any, base_model: Any, live_node: Any, gateway_server: str,
) -> None:
    tenant, api = _tenant_api(gateway_server, "acme")
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1}
    assert api.post("/v1/completions", json=body).status_code == 200
    make_user("operator", staff=True)
    page = console()
    login(page, "operator")
    page.get_by_role("link", name="Tenants and quotas").click()
    page.get_by_role("combobox", name="Tenant to edit").click()  # Mantine 9 Select: role combobox
    page.get_by_role("option", name=re.compile(r"\(acme\)")).click()
    form = page.get_by_role("form", name="Gateway limits of acme")
    form.get_by_role("textbox", name="Requests per minute (RPM)").fill("1")
    form.get_by_role("button", name="Save limits").click()
    expect(page.get_by_role("status")).to_contain_text("Limits of acme saved")
    screenshot(page, "operator-tenant-limits")
    tenant.refresh_from_db()
    assert tenant.rpm_limit == 1
    assert FleetAuditRecord.objects.get(action="set_limits").after["rpm_limit"] == 1
    # Real requests through the gateway: within a second every gateway process has the new limit; one request in
    # the minute's window is allowed, the next is refused (a window boundary can let one more through).
    answers = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not answers or answers[-1].status_code != 429):
        answers.append(api.post("/v1/completions", json=body))
    assert answers[-1].status_code == 429, [a.status_code for a in answers]
    assert answers[-1].json()["error"]["code"] == "rate_limit_exceeded"
    assert int(answers[-1].headers["Retry-After"]) >= 1
    assert answers[-1].headers["x-ratelimit-limit-requests"] == "1"
    assert len(answers) <= 3


def test_tenant_b_sees_no_operator_pages_and_nothing_of_tenant_a(
    console: Any, make_user: Any, base_model: Any, gateway_server: str,
) -> None:
    from tests.console.fleet_data import seed_fleet

    acme = TenantFactory(slug="acme", name="Acme")
    seed_fleet(acme, base_model)  # acme's nodes, placements and traffic exist
    beta = TenantFactory(slug="beta", name="Beta")
    UsageRecord.objects.create(tenant=beta, model_name="tiny-llama", endpoint="completions", status_code=200,
                               prompt_tokens=1, completion_tokens=1, latency_ms=5.0)
    make_user("bob", beta)
    page = console()
    login(page, "bob")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Adapters")).to_be_visible()
    for operator_link in ("Fleet", "Residency map", "Traffic", "Tenants and quotas", "Audit log"):
        expect(nav.get_by_role("link", name=operator_link)).to_have_count(0)
    page.goto("/operator/residency")
    expect(page.get_by_role("alert")).to_contain_text("need a staff account")
    expect(page.get_by_text("HTTP 403")).to_have_count(0)
    screenshot(page, "non-staff-operator-page")
    api = page.context.request
    assert [r["tenant"] for r in api.get("/api/v1/usage/traffic").json()] == ["beta"]
    page.goto("/usage")
    table = page.get_by_role("table", name="Traffic per adapter")
    expect(table).to_contain_text("tiny-llama", timeout=20_000)
    expect(page.get_by_text("capitals")).to_have_count(0)
    page.goto("/adapters")
    expect(page.get_by_text("No adapters yet")).to_be_visible()
    page.wait_for_load_state("networkidle")
    expect(page.get_by_text("capitals")).to_have_count(0)
    assert api.get("/api/v1/usage/traffic", headers={"X-Quiver-Tenant": "acme"}).status == 404
    for path in ("/api/v1/operator/traffic", "/api/v1/operator/tenants", "/api/v1/operator/nodes/gpu-1/samples",
                 "/api/v1/operator/nodes"):
        assert api.get(path).status == 403, path
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    refused = api.patch("/api/v1/operator/tenants/acme/limits", data={"rpm_limit": 1000},
                        headers={"X-CSRFToken": csrf})
    assert refused.status == 403 and "staff account" in refused.json()["detail"], refused.text()
    acme.refresh_from_db()
    assert acme.rpm_limit is None
