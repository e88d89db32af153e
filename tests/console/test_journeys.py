"""User journeys in a real browser against the real stack (uvicorn + PostgreSQL + S3 + Celery; vLLM for the playground).

Each journey also saves screenshots of the pages it passes at 1280 px and 390 px (see ``conftest.SHOTS``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from adapters_app.models import AdapterVersion
from demo.assets import DemoAssets
from tenants.models import ApiKey
from tests.console.conftest import WIDTHS, login, screenshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _upload_folder(page: Any, folder: Path, adapter: str | None = None) -> None:
    if adapter is not None:
        page.get_by_label("Adapter name").fill(adapter)
    page.locator('input[aria-label="Choose adapter folder"]').set_input_files(str(folder))
    page.get_by_role("button", name="Upload", exact=True).click()


def test_log_in_upload_the_demo_folder_and_watch_it_turn_ready(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None
) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant, role="member")
    page = console()
    page.goto("/adapters")  # not logged in: sent to the login form
    expect(page).to_have_url(re.compile(r"/login$"))
    screenshot(page, "login")
    login(page, "alice")
    expect(page).to_have_url(re.compile(r"/adapters$"))
    _upload_folder(page, demo_assets.adapters["capitals"], adapter="capitals")
    # Straight to S3: hashing, signing, parts, completion and the worker's sha256 check take a few round trips.
    expect(page.get_by_test_id("overall-progress")).to_have_text("100 %", timeout=60_000)
    expect(page.get_by_label("adapter_model.safetensors progress")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("Uploaded capitals v1", timeout=60_000)
    row = page.get_by_role("row", name=re.compile("capitals"))
    expect(row.get_by_text("ready")).to_be_visible(timeout=120_000)  # live: polled, no reload
    version = AdapterVersion.objects.get(adapter__tenant=tenant, adapter__name="capitals")
    assert version.status == "ready" and {f["name"] for f in version.files} == {
        "adapter_config.json", "adapter_model.safetensors"}
    screenshot(page, "adapters")
    page.get_by_role("link", name="capitals").click()
    expect(page.get_by_test_id("version-1")).to_contain_text("ready")
    screenshot(page, "adapter-detail")


def test_a_rejected_upload_shows_its_report(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None, tmp_path: Path
) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant)
    broken = tmp_path / "too-high-rank"
    shutil.copytree(demo_assets.adapters["upper"], broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    config["r"] = 64  # above the pool's max_lora_rank (16)
    (broken / "adapter_config.json").write_text(json.dumps(config))
    page = console()
    login(page, "alice")
    _upload_folder(page, broken, adapter="too-big")
    expect(page.get_by_role("status")).to_contain_text("Uploaded too-big v1", timeout=60_000)
    page.get_by_role("link", name="too-big").click()
    expect(page.get_by_test_id("version-1")).to_contain_text("rejected", timeout=120_000)
    page.get_by_test_id("version-1").get_by_role("button", name="Show report").click()
    report = AdapterVersion.objects.get(adapter__name="too-big").validation_report
    first = next(p for p in report["problems"] if p["severity"] == "error")
    table = page.get_by_role("table", name="Problems")
    expect(page.get_by_text("Rejected by validation")).to_be_visible()
    expect(table).to_contain_text(first["code"])
    expect(table).to_contain_text(first["hint"][:40])
    screenshot(page, "validation-report")


def test_create_a_key_see_it_once_and_revoke_it(console: Any, make_user: Any, gateway_server: str) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant)
    page = console()
    login(page, "alice")
    page.get_by_role("link", name="API keys").click()
    page.get_by_role("heading", name="API keys").wait_for()
    page.get_by_role("textbox", name="Name", exact=True).fill("ci-deploy")
    page.get_by_role("checkbox", name="adapters:read").check()
    # A 24-hour clock, as every time in the console (the datetime-local picker showed AM/PM in en-US).
    page.get_by_label("Expires on (optional)").fill("2030-01-02")
    page.get_by_role("textbox", name="at (24-hour, HH:MM)").fill("17:30")
    page.get_by_role("textbox", name="Only these adapters (optional)").fill("not-uploaded-yet")
    page.get_by_role("button", name="Create key").click()
    expect(page.get_by_test_id("new-key-warning")).to_contain_text("not-uploaded-yet exists yet")
    secret = page.get_by_test_id("new-secret").inner_text().strip()
    assert secret.startswith("qv_")
    expect(page.get_by_role("button", name="Copy to clipboard")).to_be_visible()
    screenshot(page, "api-key-created")
    page.get_by_role("button", name="Done").click()
    row = page.get_by_test_id("key-ci-deploy")
    expect(row).to_contain_text(".****")
    expect(row).to_contain_text("17:30:00")
    assert secret not in page.content()  # shown once: gone after the dialog closes
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{gateway_server}/api/v1/adapters", headers=headers).status_code == 200
    screenshot(page, "api-keys")
    row.get_by_role("button", name="Revoke ci-deploy").click()
    page.get_by_role("button", name="Revoke key").click()
    expect(row).to_contain_text("revoked")
    assert not ApiKey.objects.get(name="ci-deploy").enabled
    assert httpx.get(f"{gateway_server}/api/v1/adapters", headers=headers).status_code == 401


def test_a_tenant_b_user_sees_nothing_of_tenant_a(
    console: Any, make_user: Any, base_model: Any, gateway_server: str
) -> None:
    from adapters_app.services import adapter_create

    a, b = TenantFactory(slug="acme", name="Acme"), TenantFactory(slug="beta", name="Beta")
    adapter_create(a, name="acme-secret", base_model_name="tiny-llama")
    adapter_create(b, name="beta-bot", base_model_name="tiny-llama")
    make_user("bob", b)
    page = console()
    login(page, "bob")
    expect(page.get_by_role("link", name="beta-bot")).to_be_visible()
    expect(page.get_by_text("acme-secret")).to_have_count(0)
    page.goto("/adapters/acme-secret")
    expect(page.get_by_role("alert")).to_contain_text("not found")
    # The API under bob's session: another tenant is a 404, by header or by name.
    api = page.context.request
    assert api.get("/api/v1/adapters/acme-secret").status == 404
    assert api.get("/api/v1/adapters", headers={"X-Quiver-Tenant": "acme"}).status == 404
    assert [x["name"] for x in api.get("/api/v1/adapters").json()] == ["beta-bot"]
    assert api.get("/api/v1/operator/nodes").status == 403


def test_an_unknown_address_shows_the_consoles_not_found_page_with_a_way_back(console: Any, make_user: Any) -> None:
    make_user("nina", TenantFactory(slug="acme", name="Acme"))
    page = console()
    login(page, "nina")
    page.goto("/nonexistent")
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("Nothing lives at /nonexistent")
    expect(page.get_by_text("Hey developer")).to_have_count(0)  # React Router's page for an app without its own
    screenshot(page, "not-found")
    page.get_by_role("link", name="Go to the console's start page").click()
    expect(page.get_by_role("heading", name="Adapters", level=2)).to_be_visible()
    expect(page).to_have_url(re.compile(r"/adapters$"))


def test_playground_streams_the_adapter_beside_the_base_model(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None, live_node: Any,
    gateway_server: str
) -> None:
    from demo.api_client import upload_adapter, wait_validated
    from tenants.services import api_key_create

    tenant = TenantFactory(slug="acme", name="Acme")
    _, key = api_key_create(tenant, name="setup")
    api = httpx.Client(base_url=gateway_server, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    number = upload_adapter(api, "capitals", demo_assets.adapters["capitals"], base_model="tiny-llama")["number"]
    assert wait_validated(api, "capitals", number)["status"] == "ready"
    make_user("alice", tenant)
    page = console()
    login(page, "alice")
    page.get_by_role("link", name="Playground").click()
    page.get_by_role("heading", name="Playground").wait_for()
    # Nothing sent yet: a hint, not the "…" of a request in flight.
    expect(page.get_by_test_id("answer-base")).to_have_text("Send a prompt to see the answer here.")
    example = demo_assets.examples["capitals"][0]
    page.get_by_label("Prompt").fill(example["prompt"])
    page.get_by_label("Max tokens").fill("12")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("answer-adapter")).to_contain_text(example["completion"].strip(), timeout=120_000)
    expect(page.get_by_test_id("answer-base")).not_to_have_text("…", timeout=60_000)
    screenshot(page, "playground")


def test_screenshots_of_every_page_at_both_widths(
    console: Any, make_user: Any, base_model: Any, gateway_server: str
) -> None:
    from tests.console.fleet_data import seed_fleet

    # A name a little longer than "Acme": at 390 px the header's picker must still show it whole.
    tenant = TenantFactory(slug="acme", name="Acme Labs")
    seed_fleet(tenant, base_model)  # nodes with history, placements and traffic, so no chart is empty
    make_user("alice", tenant)
    make_user("operator", staff=True)
    pages = {"alice": ["/adapters", "/adapters/capitals", "/keys", "/playground", "/usage", "/operator/nodes"],
             "operator": ["/", "/operator/nodes", "/operator/residency", "/operator/traffic", "/operator/tenants",
                          "/operator/audit"]}
    for width in WIDTHS:
        for user, paths in pages.items():
            page = console(width)
            login(page, user)
            for path in paths:
                page.goto(path)
                page.get_by_role("heading", level=2).first.wait_for()
                page.wait_for_load_state("networkidle")
                if width == "mobile":  # nothing may overflow the 390 px viewport horizontally
                    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    assert overflow <= 0, (path, overflow)
                    picker = page.get_by_role("banner").get_by_role("combobox", name="Tenant", exact=True)
                    box = picker.bounding_box()
                    assert box is not None and box["x"] + box["width"] <= WIDTHS["mobile"][0], (path, box)
                    expect(picker).to_have_value(re.compile(r"^Acme Labs \("))
                    assert picker.evaluate("e => e.scrollWidth <= e.clientWidth"), (path, "tenant name cut off")
                name = "tenant-picker" if path == "/" else path.strip("/").replace("/", "-")
                screenshot(page, f"{user}-{name}")


def test_operator_pins_and_evicts_with_confirmation_and_sees_the_audit_log(
    console: Any, make_user: Any, base_model: Any
) -> None:
    from django.utils import timezone

    from adapters_app.services import adapter_create
    from inference.fleet.models import FleetAuditRecord, Node, Placement

    tenant = TenantFactory(slug="acme", name="Acme")
    adapter = adapter_create(tenant, name="capitals", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64,
                                            size_bytes=4096, s3_prefix="x/", files=[], status="ready")
    node = Node.objects.create(name="gpu-1", base_model=base_model, agent_url="http://127.0.0.1:9",
                               engine_url="http://127.0.0.1:9", healthy=True, last_heartbeat_at=timezone.now(),
                               max_loras=4, max_cpu_loras=8, kv_cache_usage_perc=0.35, max_loras_ceiling=4,
                               max_cpu_loras_ceiling=8,
                               # The engine said 12 slots; the operator's ceiling of 4 is in force (issue 30: the
                               # page showed no reported figure beside the ceiling). One adapter in a slot, one more
                               # in the CPU cache only: vLLM's cache counts both.
                               state={"max_loras": 12, "max_cpu_loras": 8, "residency": {"gpu": 1, "cpu": 1}})
    Placement.objects.create(node=node, adapter_version=version, tier="hot", served=True)
    other = AdapterVersion.objects.create(tenant=tenant, adapter=adapter_create(tenant, name="sums",
                                          base_model_name="tiny-llama"), number=1, sha256="1" * 64,
                                          size_bytes=4096, s3_prefix="y/", files=[], status="ready")
    Placement.objects.create(node=node, adapter_version=other, tier="warm", served=True)
    make_user("operator", staff=True)
    page = console()
    failed: list[tuple[int, str]] = []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    login(page, "operator")
    # Operators land on the fleet (not on a tenant's adapters as a viewer), and neither the login form nor the
    # console's start asked anything that failed (the session probe answers 200 before login).
    expect(page).to_have_url(re.compile(r"/operator/nodes$"))
    expect(page.get_by_label("Node gpu-1")).to_contain_text("KV-cache pressure 35 %")
    capacity = page.get_by_role("table", name="Capacity of gpu-1")
    cells = [capacity.get_by_role("row", name=re.compile(f"^{label}")).get_by_role("cell")
             for label in ("LoRA slots", "CPU cache", "LoRA rank")]
    expect(cells[0]).to_have_text(["LoRA slots", "12", "4", "4 (ceiling, report clamped)"])
    expect(cells[1]).to_have_text(["CPU cache", "8", "8", "8 (reported = ceiling)"])
    expect(cells[2]).to_have_text(["LoRA rank", "—", "16", "0 (nothing reported)"])  # the base model's rank: the fleet's
    expect(page.get_by_label("Node gpu-1")).to_contain_text("CPU cache, LoRA slots included (max_cpu_loras)2/8"
                                                            "1 in LoRA slots + 1 in the CPU cache only")
    screenshot(page, "operator-fleet")
    assert failed == []
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="API keys")).to_have_count(0)  # a viewer of acme: listed, disabled
    expect(nav).to_contain_text("Needs the member role in acme")
    page.get_by_role("link", name="Residency map").click()
    page.get_by_role("button", name="pin acme/capitals v1 on gpu-1").click()
    page.get_by_role("button", name="Confirm pin").click()
    expect(page.get_by_role("status")).to_contain_text("pin acme/capitals v1 on gpu-1: requested")
    # Pinned now: the row offers unpin instead of evict (the API refuses to evict a pinned placement).
    expect(page.get_by_role("button", name="evict acme/capitals v1 on gpu-1")).to_have_count(0)
    page.get_by_role("button", name="evict acme/sums v1 on gpu-1").click()
    expect(page.get_by_role("dialog")).to_contain_text("recorded in the audit log")
    page.get_by_role("button", name="Confirm evict").click()
    expect(page.get_by_role("status")).to_contain_text("evict acme/sums v1 on gpu-1: requested")
    screenshot(page, "operator-actions")
    assert list(FleetAuditRecord.objects.order_by("id").values_list("action", "actor")) == [
        ("pin", "operator"), ("evict", "operator")]
    page.get_by_role("link", name="Audit log").click()
    table = page.get_by_role("table", name="Audit log")
    expect(table.get_by_role("row")).to_have_count(3)
    expect(table).to_contain_text("evict")
    expect(table).to_contain_text("pin")
    screenshot(page, "operator-audit")
