"""Operator APIs under hostile input: numbers past the database's integer range are a 400 naming the field, and a
staff session cannot be driven cross-site (CSRF enforced on session auth)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def op() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user(username="ops-rex", password="x", is_staff=True))
    return client


@pytest.mark.parametrize("value", [2**31, 10**30])
def test_limits_past_the_integer_range_are_a_400_naming_the_field(op: APIClient, make_session_client: Any,
                                                                  value: int) -> None:
    _, tenant, _ = make_session_client(role="owner")
    for field in ("rpm_limit", "tpm_limit", "concurrency_limit", "max_tokens_limit"):
        answer = op.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {field: value}, format="json")
        assert answer.status_code == 400, (field, answer.status_code, answer.content[:300])
        assert field in answer.json()["fields"]
    for field in ("max_pinned", "max_gpu_bytes"):
        body = {"max_pinned": None, "max_gpu_bytes": None, field: value * 2**33}
        answer = op.put(f"/api/v1/operator/residency-quotas/{tenant.slug}", body, format="json")
        assert answer.status_code == 400, (field, answer.status_code, answer.content[:300])


def test_a_staff_session_without_the_csrf_token_cannot_change_limits(make_session_client: Any) -> None:
    _, tenant, _ = make_session_client(role="owner")
    forged = APIClient(enforce_csrf_checks=True)
    forged.force_login(User.objects.create_user(username="ops-csrf", password="x", is_staff=True))
    answer = forged.patch(f"/api/v1/operator/tenants/{tenant.slug}/limits", {"rpm_limit": 1}, format="json")
    assert answer.status_code == 403
    tenant.refresh_from_db()
    assert tenant.rpm_limit is None
