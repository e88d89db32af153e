"""Schemathesis against the control plane's OpenAPI schema (drf-spectacular): no operation answers 5xx, whatever
the generated input (valid and invalid), for a tenant's API key and for a console session (a staff user who owns a
tenant, so the operator routes are reached too).

The schema is the committed ``frontend/src/api/openapi.json`` (``tests/frontend/test_api_client.py`` keeps it equal
to what ``/api/v1/schema`` serves); requests go through the WSGI app in this thread, so they see each test's rows.
Bounded and deterministic, so it cannot flake: a fixed seed, derandomized Hypothesis, no example database, no
stateful phase. Random cases (``MAX_EXAMPLES`` per operation and caller) reach every route but seldom a boundary, so
the operations that take a body also get schemathesis' coverage phase (values at and past each limit, missing and
extra fields) as a tenant key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, Phase, settings

from tenants.services import api_key_create, membership_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db
MAX_EXAMPLES = 5
SEED = 20261201
CSRF = "q" * 32  # any well-formed secret; the header and cookie only have to agree
config = schemathesis.config.SchemathesisConfig.from_dict({
    "seed": SEED,
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    # Our credentials only: generated security parameters would replace them and stop every case at 401.
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none",
                   "with-security-parameters": False},
})
schema = schemathesis.openapi.from_path(Path(__file__).resolve().parents[1] / "frontend/src/api/openapi.json",
                                        config=config)
# Boundary values (schemathesis' coverage phase: lengths at and past maxLength, numbers at their limits, missing and
# extra fields) for the operations that take a body, as a tenant key.
boundaries = schemathesis.openapi.from_path(
    Path(__file__).resolve().parents[1] / "frontend/src/api/openapi.json",
    config=schemathesis.config.SchemathesisConfig.from_dict({
        "seed": SEED,
        "phases": {"examples": {"enabled": False}, "fuzzing": {"enabled": False}, "stateful": {"enabled": False}},
        "generation": {"deterministic": True, "database": "none", "with-security-parameters": False},
    })).include(method=["POST", "PUT", "PATCH"])
app = get_wsgi_application()
bounded = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                   phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def _no_5xx(case: Any, **call: Any) -> None:
    response = case.call(app=app, **call)
    assert response.status_code < 500, (f"{case.method} {case.formatted_path} → {response.status_code}: "
                                        f"{response.text[:500]}\n{case.as_curl_command()}")


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Iterator[None]:
    """Django closes the connection at the end of each WSGI request, which would end the test's transaction;
    its own test client disconnects that handler the same way."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def tenant_key() -> str:
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="fuzz")
    return key


@pytest.fixture
def staff_owner(django_user_model: Any) -> Any:
    tenant = TenantFactory()
    user = django_user_model.objects.create_user(username=f"fuzz-{tenant.slug}", password="unused-pw", is_staff=True)
    membership_create(tenant, user=user, role="owner")
    return user


@pytest.fixture
def session_of(staff_owner: Any) -> Any:
    """``session_of(fresh)``: the staff owner's session key; a new one when ``fresh`` (after a logout ended it)."""
    keys: list[str] = []

    def get(fresh: bool = False) -> str:
        if fresh or not keys:
            client = Client()
            client.force_login(staff_owner)
            keys[:] = [client.cookies["sessionid"].value]
        return keys[0]

    return get


@schema.parametrize()
@bounded
def test_no_5xx_as_a_tenant_key(case: Any, tenant_key: str, base_model: Any) -> None:
    _no_5xx(case, headers={"Authorization": f"Bearer {tenant_key}"})


@schema.parametrize()
@bounded
def test_no_5xx_as_a_staff_owner_session(case: Any, session_of: Any, base_model: Any) -> None:
    # A generated logout ends the session it is sent with: the next case gets a new one.
    session = session_of(fresh=False)
    _no_5xx(case, headers={"X-CSRFToken": CSRF}, cookies={"sessionid": session, "csrftoken": CSRF})
    if case.operation.path == "/api/v1/auth/logout":
        session_of(fresh=True)


@boundaries.parametrize()
@bounded
def test_no_5xx_at_the_boundaries_as_a_tenant_key(case: Any, tenant_key: str, base_model: Any) -> None:
    _no_5xx(case, headers={"Authorization": f"Bearer {tenant_key}"})
