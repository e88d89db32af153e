"""Browser journeys against the real stack: Debian's Chromium driven by Playwright (Python), launched once per session.

The console is built from the lockfile if needed (``devtools.frontend``) and served by the session's uvicorn
(``gateway_server``) from the test database; uploads go through the real S3 server and a real Celery worker.
Screenshots of every page at 1280 px and 390 px land in ``QUIVER_SCREENSHOT_DIR`` (default
``.cache/console-screenshots``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from devtools.frontend import ensure_console_built
from tenants.models import Tenant
from tenants.services import membership_create

# Playwright's sync API runs an event loop in this thread; the test's ORM calls are still plain synchronous ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("QUIVER_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"]
WIDTHS = {"desktop": (1280, 900), "mobile": (390, 844)}
SHOTS = Path(os.environ.get("QUIVER_SCREENSHOT_DIR", Path(__file__).resolve().parents[2] / ".cache" / "console-screenshots"))
PASSWORD = "journey-password-1"


@pytest.fixture(scope="session")
def console_built() -> Path:
    """``frontend/dist``, built when missing or stale."""
    return ensure_console_built()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the whole session (Debian's package; never ``playwright install``)."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does this).")
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def console(browser: Any, console_built: Path, gateway_server: str) -> Iterator[Callable[..., Any]]:
    """``console(width="desktop")`` → a fresh page (own cookies) on the console; every page is closed afterwards.

    ``console_built`` comes before the server: whitenoise indexes the assets when the server starts."""
    contexts: list[Any] = []

    def open_page(width: str = "desktop") -> Any:
        w, h = WIDTHS[width]
        context = browser.new_context(viewport={"width": w, "height": h}, base_url=gateway_server)
        context.set_default_timeout(20_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def make_user() -> Callable[..., User]:
    """``make_user(username, tenant=None, role="owner", staff=False)`` → a user with :data:`PASSWORD`."""

    def make(username: str, tenant: Tenant | None = None, role: str = "owner", staff: bool = False) -> User:
        user = User.objects.create_user(username=username, password=PASSWORD, is_staff=staff)
        if tenant is not None:
            membership_create(tenant, user=user, role=role)
        return user

    return make


def login(page: Any, username: str, password: str = PASSWORD) -> None:
    """Log in through the form and wait for the console's shell."""
    page.goto("/login")
    page.get_by_role("textbox", name="Username").fill(username)
    page.get_by_role("textbox", name="Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", level=3, name="Quiver").wait_for()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``<name>-<width>px.png`` under :data:`SHOTS`."""
    path = SHOTS / f"{name}-{page.viewport_size['width']}px.png"
    page.screenshot(path=str(path), full_page=True)
    return path
