"""Django's own 400s name their cause (config.error_views.bad_request), served by a real uvicorn."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_host_outside_allowed_hosts_is_told_so_not_blamed_on_body_size(gateway_server: str) -> None:
    # Found by the attack round: a wrong Host got "too many files or fields, or a body over the size limit".
    answer = httpx.get(f"{gateway_server}/api/v1/auth/session", headers={"Host": "evil.example"}, timeout=10)
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "disallowed_host", body
    assert "evil.example" in body["detail"] and "DJANGO_ALLOWED_HOSTS" in body["detail"]
    assert "size" not in body["detail"]

