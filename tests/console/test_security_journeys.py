"""Browser journeys for issue 30: membership by consent in the console, and the console under its CSP.

Real Chromium, the session's uvicorn, PostgreSQL and S3 (tests/console/conftest.py). The upload journeys
(test_journeys.py, test_upload_journeys.py) run under the same policy: hashing with WebAssembly and PUTs to S3.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tenants.models import Invitation, Membership
from tests.console.conftest import login, screenshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _csp_violations(page: Any) -> list[str]:
    """Collects, from now on, what Chromium reports as blocked by the page's Content-Security-Policy."""
    seen: list[str] = []
    page.on("console", lambda msg: seen.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.add_init_script("document.addEventListener('securitypolicyviolation', e => "
                         "console.error('Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI))")
    return seen


def test_an_invitation_is_accepted_by_its_addressee_in_the_console(console: Any, make_user: Any) -> None:
    acme = TenantFactory(slug="acme", name="Acme")
    home = TenantFactory(slug="home", name="Home")
    make_user("olga", acme, role="owner")
    newbie = make_user("newbie", home, role="owner")
    owner = console()
    violations = _csp_violations(owner)
    login(owner, "olga")
    owner.get_by_role("link", name="Members").click()
    form = owner.get_by_role("form", name="Invite a user")
    form.get_by_label("Username").fill("newbie")
    form.get_by_role("button", name="Invite").click()
    expect(owner.get_by_role("status")).to_contain_text("Invitation to 'newbie' saved")
    expect(owner.get_by_test_id("pending-newbie")).to_be_visible()
    # An unknown username gets the same answer: the console cannot tell the two apart either.
    form.get_by_label("Username").fill("ghost")
    form.get_by_role("button", name="Invite").click()
    expect(owner.get_by_role("status")).to_contain_text("Invitation to 'ghost' saved")
    screenshot(owner, "members")
    assert not Membership.objects.filter(tenant=acme, user=newbie).exists()  # invited, not added

    invitee = console()
    login(invitee, "newbie")
    banner = invitee.get_by_test_id("invitation-acme")
    expect(banner).to_contain_text("olga invited you to join Acme (acme) as member")
    screenshot(invitee, "invitation")
    banner.get_by_role("button", name="Accept").click()
    expect(banner).to_have_count(0)
    assert Membership.objects.get(tenant=acme, user=newbie).role == "member"
    assert not Invitation.objects.filter(tenant=acme, username="newbie").exists()
    # The tenant the console acted in stays chosen (no "pick a tenant" break); the new one is in the picker.
    expect(invitee.get_by_role("combobox", name="Tenant")).to_have_value("Home (owner)")
    invitee.get_by_role("combobox", name="Tenant").click()
    expect(invitee.get_by_role("option", name="Acme (member)")).to_be_visible()
    assert violations == [], violations


def test_a_declined_invitation_leaves_no_membership(console: Any, make_user: Any) -> None:
    acme = TenantFactory(slug="acme", name="Acme")
    owner = make_user("olga", acme, role="owner")
    newbie = make_user("newbie")
    Invitation.objects.create(tenant=acme, username="newbie", role="viewer", invited_by=owner,
                              expires_at="2999-01-01T00:00:00Z")
    page = console()
    login(page, "newbie")
    banner = page.get_by_test_id("invitation-acme")
    banner.get_by_role("button", name="Decline").click()
    expect(banner).to_have_count(0)
    assert not Membership.objects.filter(user=newbie).exists()
    assert not Invitation.objects.filter(username="newbie").exists()


def test_the_console_sends_a_csp_and_its_pages_break_none_of_it(console: Any, make_user: Any,
                                                                 gateway_server: str) -> None:
    head = httpx.get(f"{gateway_server}/adapters", timeout=10)
    policy = head.headers.get("content-security-policy", "")
    for directive in ("default-src 'self'", "script-src 'self' 'wasm-unsafe-eval'", "object-src 'none'",
                      "frame-ancestors 'none'", "connect-src 'self'"):
        assert directive in policy, (directive, policy)
    assert "'unsafe-eval'" not in policy.replace("'wasm-unsafe-eval'", "")
    assert "script-src 'self' 'unsafe-inline'" not in policy
    tenant = TenantFactory(slug="acme", name="Acme")
    make_user("olga", tenant, role="owner")
    make_user("op", staff=True)
    page = console()
    violations = _csp_violations(page)
    login(page, "olga")
    for path in ("/adapters", "/keys", "/usage", "/members", "/playground"):
        page.goto(path)
        expect(page.get_by_role("heading", level=2)).to_be_visible()
    operator = console()
    violations += _csp_violations(operator)
    login(operator, "op")
    for path in ("/operator/nodes", "/operator/residency", "/operator/traffic", "/operator/tenants"):
        operator.goto(path)
        expect(operator.get_by_role("heading", level=2).first).to_be_visible()
    expect(operator).to_have_url(re.compile(r"/operator/tenants$"))
    assert violations == [], violations
