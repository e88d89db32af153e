"""Browser-direct uploads in a real browser: the parts go from Chromium straight to SeaweedFS on presigned URLs
(cross-origin, so the bucket's CORS must expose ETag), the server completes them, a real worker checks sha256."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from playwright.sync_api import expect

from adapters_app import storage
from adapters_app.models import AdapterVersion, Upload
from demo.assets import DemoAssets
from tests.console.conftest import login, screenshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _choose(page: Any, folder: Path, adapter: str) -> None:
    page.get_by_label("Adapter name").fill(adapter)
    page.locator('input[aria-label="Choose adapter folder"]').set_input_files(str(folder))


def _s3_parts(page: Any) -> re.Pattern[str]:
    """The presigned part PUTs, on the S3 endpoint the browser talks to."""
    endpoint = django_settings.AWS_S3_BROWSER_ENDPOINT_URL or django_settings.AWS_S3_ENDPOINT_URL
    return re.compile(re.escape(endpoint) + r"/.*[?&]partNumber=\d+")


def test_upload_goes_straight_to_s3_and_the_version_turns_ready(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None
) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant, role="member")
    page = console()
    login(page, "alice")
    s3_puts: list[str] = []
    page.on("request", lambda r: s3_puts.append(r.url) if r.method == "PUT" and "partNumber=" in r.url else None)
    django_puts: list[str] = []
    page.on("request", lambda r: django_puts.append(r.url) if r.method == "POST" and r.url.endswith("/versions") else None)
    extra: list[str] = []  # part URLs come with the create response; a fresh upload has no parts to list
    page.on("request", lambda r: extra.append(r.url) if re.search(r"/uploads/[0-9a-f]+/(sign|parts)", r.url) else None)
    _choose(page, demo_assets.adapters["capitals"], "capitals")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_test_id("overall-progress")).to_have_text("100 %", timeout=60_000)
    expect(page.get_by_label("adapter_model.safetensors progress")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("Uploaded capitals v1", timeout=60_000)
    row = page.get_by_role("row", name=re.compile("capitals"))
    expect(row.get_by_text("ready")).to_be_visible(timeout=120_000)  # polled, no reload
    upload = Upload.objects.get(tenant=tenant)
    assert upload.state == "done" and upload.version is not None and upload.version.status == "ready"
    assert len(s3_puts) == 2 and django_puts == []  # one part per small file, straight to S3
    assert extra == []
    screenshot(page, "upload-direct")


def test_cancel_aborts_the_upload_and_leaves_nothing(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None
) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant, role="member")
    page = console()
    login(page, "alice")
    held: list[Any] = []
    page.route(_s3_parts(page), lambda route: held.append(route))  # the part PUTs hang: a slow link
    _choose(page, demo_assets.adapters["capitals"], "capitals")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("button", name="Cancel")).to_be_visible()
    for _ in range(100):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the browser never started a part upload"
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("status")).to_contain_text("Upload cancelled.", timeout=30_000)
    upload = Upload.objects.get(tenant=tenant)
    for _ in range(50):
        upload.refresh_from_db()
        if upload.state == "aborted":
            break
        page.wait_for_timeout(100)
    assert upload.state == "aborted"
    assert storage.multipart_uploads(f"tenants/{tenant.pk}/") == []
    assert not AdapterVersion.objects.filter(tenant=tenant).exists()
    for route in held:
        try:
            route.abort()
        except Exception:  # noqa: BLE001 - already cancelled by the page
            pass


def test_a_dropped_connection_resumes_without_resending_stored_parts(
    console: Any, make_user: Any, demo_assets: DemoAssets, base_model: Any, celery_worker: None, settings: Any,
    tmp_path: Path
) -> None:
    settings.QUIVER_UPLOAD_PART_BYTES = 5 * 1024 * 1024  # S3's minimum: 11 MiB of weights is three parts
    folder = tmp_path / "big"
    folder.mkdir()
    shutil.copy(demo_assets.adapters["capitals"] / "adapter_config.json", folder)
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(11 * 1024 * 1024))
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("alice", tenant, role="member")
    page = console()
    login(page, "alice")
    sent: dict[str, int] = {}
    drops = {"left": 4}  # part 2 fails the first try and Uppy's three retries: the file is "failed"

    def flaky(route: Any) -> None:
        number = re.search(r"partNumber=(\d+)", route.request.url).group(1)  # type: ignore[union-attr]
        if number == "2" and drops["left"] > 0:
            drops["left"] -= 1
            route.abort("connectionreset")
            return
        sent[number] = sent.get(number, 0) + 1
        route.continue_()

    page.route(_s3_parts(page), flaky)
    _choose(page, folder, "big-one")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_text("The connection dropped")).to_be_visible(timeout=90_000)
    screenshot(page, "upload-paused")
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_test_id("overall-progress")).to_have_text("100 %", timeout=60_000)
    expect(page.get_by_role("status")).to_contain_text("Uploaded big-one v1", timeout=60_000)
    assert sent.get("1") == 2 and sent.get("2") == 1 and sent.get("3") == 1, sent  # part 1: config + weights
    version = AdapterVersion.objects.get(tenant=tenant)
    assert version.size_bytes == 11 * 1024 * 1024 + (folder / "adapter_config.json").stat().st_size
