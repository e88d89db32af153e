"""Another tenant's object is a 404 on every endpoint, never a 403 (conventions §3), via the reusable matrix."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from django.contrib.auth.models import User

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.metering.models import UsageRecord
from tenants.invitations import invitation_create
from tenants.models import Tenant
from tenants.services import api_key_create, membership_create
from tests.fixtures.tenancy import UPLOAD, TenantScopedAPITests

pytestmark = pytest.mark.django_db


def _ready_adapter(tenant: Tenant, name: str) -> AdapterVersion:
    adapter = adapter_create(tenant, name=name, base_model_name="tiny-llama")
    return AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="0" * 64, size_bytes=1,
                                         s3_prefix="x/", files=[], status="ready")


class TestAdapters(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/adapters/{name}", None),
        ("delete", "/api/v1/adapters/{name}", None),
        ("get", "/api/v1/adapters/{name}/versions", None),
        ("get", "/api/v1/adapters/{name}/versions/1", None),
        ("post", "/api/v1/adapters/{name}/versions", UPLOAD),
    ]
    list_url = "/api/v1/adapters"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        _ready_adapter(tenant, "secret-bot")
        return {"name": "secret-bot"}


class TestUploads(TenantScopedAPITests):
    """Browser-direct uploads: another tenant can neither read, sign, list, complete nor abort one."""

    calls: ClassVar = [
        ("get", "/api/v1/adapters/{name}/uploads/{upload}", None),
        ("get", "/api/v1/adapters/{name}/uploads/{upload}/parts", None),
        ("post", "/api/v1/adapters/{name}/uploads/{upload}/sign", {"name": "adapter_config.json", "part_numbers": [1]}),
        ("post", "/api/v1/adapters/{name}/uploads/{upload}/complete", {"name": "adapter_config.json"}),
        ("post", "/api/v1/adapters/{name}/uploads/{upload}/abort", None),
        ("post", "/api/v1/adapters/{name}/uploads", {"files": [{"name": "adapter.zip", "size": 1, "sha256": "a" * 64}]}),
    ]

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        from adapters_app.direct_upload import upload_create

        _ready_adapter(tenant, "secret-bot")
        upload = upload_create(tenant, adapter_name="secret-bot", base_model_name=None, files=[
            {"name": "adapter_config.json", "size": 10, "sha256": "a" * 64},
            {"name": "adapter_model.safetensors", "size": 10, "sha256": "b" * 64}])
        return {"name": "secret-bot", "upload": upload.public_id}


class TestServing(TenantScopedAPITests):
    """An adapter's serving rule: another tenant can neither read nor change it, nor read its versions' figures."""

    calls: ClassVar = [
        ("get", "/api/v1/adapters/{name}/serving", None),
        ("patch", "/api/v1/adapters/{name}/serving", {"auto_promote": True}),
        ("post", "/api/v1/adapters/{name}/promote", {"version": 1}),
        ("post", "/api/v1/adapters/{name}/canary", {"version": 1, "percent": 5}),
        ("post", "/api/v1/adapters/{name}/rollback", None),
        ("get", "/api/v1/usage/versions?adapter={name}", None),
    ]

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        _ready_adapter(tenant, "secret-bot")
        return {"name": "secret-bot"}


class TestApiKeys(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/api-keys/{key_id}", None),
        ("post", "/api/v1/api-keys/{key_id}/revoke", None),
    ]
    list_url = "/api/v1/api-keys"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        key, _ = api_key_create(tenant, name="b-key")
        return {"name": "b-key", "key_id": key.key_id}


class TestGateway(TenantScopedAPITests):
    """The OpenAI-compatible gateway: models, and inference on another tenant's adapter name."""

    calls: ClassVar = [
        ("get", "/v1/models/{name}", None),
        ("post", "/v1/completions", {"model": "{name}", "prompt": "x", "max_tokens": 1}),
        ("post", "/v1/chat/completions", {"model": "{name}", "messages": [{"role": "user", "content": "x"}],
                                          "max_tokens": 1}),
    ]
    auth_kinds = ("key",)  # the OpenAI-compatible gateway takes API keys only
    list_url = "/v1/models"
    list_field = "id"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        _ready_adapter(tenant, "secret-bot")
        return {"name": "secret-bot"}

    def test_every_tenant_sees_the_base_model(self, make_client, base_model) -> None:  # type: ignore[no-untyped-def]
        client, _, _ = make_client()
        assert "tiny-llama" in self._list_names(client)


class TestMembers(TenantScopedAPITests):
    calls: ClassVar = [
        ("get", "/api/v1/members/{name}", None),
        ("patch", "/api/v1/members/{name}", {"role": "viewer"}),
        ("delete", "/api/v1/members/{name}", None),
    ]
    list_url = "/api/v1/members"
    list_field = "username"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        user = User.objects.create_user(username=f"alice-{tenant.slug}", password="x")
        membership_create(tenant, user=user, role="member")
        return {"name": user.username}


class TestInvitations(TenantScopedAPITests):
    calls: ClassVar = [("delete", "/api/v1/invitations/{id}", None)]
    list_url = "/api/v1/invitations"
    list_field = "username"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        invitation = invitation_create(tenant, username=f"invitee-{tenant.slug}", role="member", actor=None)
        return {"name": invitation.username, "id": str(invitation.pk)}


class TestUsage(TenantScopedAPITests):
    list_url = "/api/v1/usage"
    list_field = "model"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        version = _ready_adapter(tenant, "metered")
        UsageRecord.objects.create(tenant=tenant, adapter_version=version, model_name="metered", version_number=1,
                                   endpoint="completions", status_code=200, prompt_tokens=1, completion_tokens=1,
                                   latency_ms=1.0)
        return {"name": "metered"}


class TestUsageSeries(TenantScopedAPITests):
    list_url = "/api/v1/usage/series"
    list_field = "model"
    make_object = TestUsage.make_object


class TestUsageTraffic(TenantScopedAPITests):
    list_url = "/api/v1/usage/traffic"
    list_field = "model"
    make_object = TestUsage.make_object


class TestUsageRollups(TenantScopedAPITests):
    list_url = "/api/v1/usage/rollups"
    list_field = "model"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        from django.utils import timezone

        from inference.metering.models import UsageRollup

        UsageRollup.objects.create(tenant=tenant, minute=timezone.now().replace(second=0, microsecond=0),
                                   model_name="rolled", requests=1, errors=0, prompt_tokens=1, completion_tokens=1,
                                   latency_p50_ms=1.0, latency_p95_ms=1.0)
        return {"name": "rolled"}


class TestResidency(TenantScopedAPITests):
    list_url = "/api/v1/residency"
    list_field = "adapter"

    def make_object(self, tenant: Tenant) -> dict[str, Any]:
        from inference.fleet.models import Node, Placement

        version = _ready_adapter(tenant, "resident")
        node, _ = Node.objects.get_or_create(name="iso-node", defaults={"agent_url": "http://a", "engine_url": "http://e"})
        Placement.objects.create(node=node, adapter_version=version, tier="hot")
        return {"name": "resident"}


# --- The matrix itself can fail: remove tenant scoping from a family's read path and its tests must go red.

def _unscoped_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    import inference.metering.api as usage_api

    real = usage_api.usage_summary
    monkeypatch.setattr(usage_api, "usage_summary", lambda qs, **kw: real(UsageRecord.objects.all(), **kw))


def _unscoped_gateway_models(monkeypatch: pytest.MonkeyPatch) -> None:
    import inference.gateway.views as gateway_views
    from adapters_app.models import Adapter

    monkeypatch.setattr(gateway_views, "adapter_list_servable",
                        lambda tenant: Adapter.objects.filter(versions__status="ready").distinct())


def _empty_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    import inference.metering.api as usage_api

    monkeypatch.setattr(usage_api, "usage_summary", lambda qs, **kw: [])


@pytest.mark.parametrize(("family", "break_it", "test_name"), [
    (TestUsage, _unscoped_usage, "test_lists_hide_other_tenants_objects"),
    (TestUsage, _empty_usage, "test_owner_reaches_its_object"),
    (TestGateway, _unscoped_gateway_models, "test_lists_hide_other_tenants_objects"),
])
def test_formerly_vacuous_families_fail_without_scoping(family, break_it, test_name, monkeypatch,  # type: ignore[no-untyped-def]
                                                       make_client, base_model) -> None:
    break_it(monkeypatch)
    with pytest.raises(AssertionError):
        getattr(family(), test_name)(make_client, base_model)


# --- Every URL route is covered by a matrix family, or is listed here with the reason it holds no tenant object.

NOT_TENANT_OBJECTS = {
    "healthz": "liveness probe",
    "api/v1/schema": "the OpenAPI schema",
    "api/v1/base-models$": "base models are shared by every tenant",
    "api/v1/auth/login": "console login (no tenant yet)",
    "api/v1/auth/logout": "ends the caller's own session",
    "api/v1/auth/me": "the caller's own identity",
    "api/v1/auth/session": "the caller's own identity, or only that there is none",
    "api/v1/auth/tenant": "picks one of the caller's own tenants (membership checked)",
    "api/v1/api-keys/playground$": "the session user's own playground key in the tenant the session acts in; no "
                                   "object is named (tests/tenants/test_playground_key.py)",
    "api/v1/operator/nodes$": "staff-only fleet view; tenants' keys and sessions get 403 (tests/inference/gateway/"
                              "test_operator_api.py)",
    "api/v1/operator/nodes/(?P<name>[a-z0-9-]+)$": "staff-only node registry; tenants' keys and sessions get 403 "
                                                   "(tests/inference/gateway/test_operator_nodes_api.py)",
    "api/v1/operator/nodes/(?P<name>[a-z0-9-]+)/rotate$": "staff-only node registry; tenants' keys and sessions get "
                                                          "403 (tests/inference/gateway/test_operator_nodes_api.py)",
    "api/v1/operator/versions/(?P<pk>[^/.]+)$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/versions/(?P<pk>[^/.]+)/pin$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/versions/(?P<pk>[^/.]+)/replicas$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/versions/(?P<pk>[^/.]+)/unpin$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/placements/(?P<pk>[^/.]+)/evict$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/residency-quotas/(?P<slug>[^/.]+)$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/audit$": "staff-only fleet action; tenants' keys and sessions get 403 (tests/inference/gateway/test_fleet_api.py)",
    "api/v1/operator/nodes/(?P<name>[a-z0-9-]+)/samples$": "staff-only node history; tenants get 403 (tests/inference/"
                                                       "gateway/test_operator_console_api.py)",
    "api/v1/operator/traffic$": "staff-only traffic of every tenant; tenants get 403 (test_operator_console_api.py)",
    "api/v1/operator/residency$": "staff-only residency map of every tenant; tenants get 403 "
                                  "(tests/inference/fleet/test_operator_pages.py)",
    "api/v1/operator/tenants$": "staff-only tenant limits; tenants get 403 (test_operator_console_api.py)",
    "api/v1/operator/tenants/(?P<slug>[^/.]+)$": "staff-only tenant limits; tenants get 403 "
                                                "(test_operator_console_api.py)",
    "api/v1/operator/tenants/(?P<slug>[^/.]+)/limits$": "staff-only, audited limit edit; tenants get 403 "
                                                       "(test_operator_console_api.py)",
    "^(?!api/|v1/|internal/|admin/|static/|healthz|metrics)(?P<path>.*)$": "the console's index.html, no tenant data",
    "api/v1/tenant/limits": "the caller's own tenant's limits (no object id in the URL)",
    "api/v1/auth/invitations": "the signed-in user's own invitations, by username, not tenant-scoped "
                               "(tests/tenants/test_invitations.py)",
    "api/v1/auth/invitations/<int:invitation_id>/accept": "only the addressee's own invitation; anyone else's is 404 "
                                                          "(tests/tenants/test_invitations.py)",
    "api/v1/auth/invitations/<int:invitation_id>/decline": "only the addressee's own invitation; anyone else's is "
                                                           "404 (tests/tenants/test_invitations.py)",
}


def _routes(patterns: list[Any], prefix: str = "") -> list[str]:
    from django.urls import URLResolver

    found: list[str] = []
    for pattern in patterns:
        route = URLResolver._join_route(prefix, str(pattern.pattern))
        found += _routes(pattern.url_patterns, route) if isinstance(pattern, URLResolver) else [route]
    return found


def test_every_route_is_covered_by_a_matrix_family() -> None:
    from django.urls import get_resolver, resolve

    sample = {"name": "secret-bot", "key_id": "0123456789ab", "upload": "0" * 32, "id": "1"}
    covered = set()
    for family in TenantScopedAPITests.__subclasses__():
        urls = [template.format(**sample) for _, template, _ in family.calls]
        urls += [family.list_url] if family.list_url else []
        covered |= {resolve(url.split("?")[0]).route for url in urls}
    missing = [r for r in _routes(get_resolver().url_patterns) if r not in covered and r not in NOT_TENANT_OBJECTS]
    assert not missing, f"routes no matrix family covers (add calls, or a reason to NOT_TENANT_OBJECTS): {missing}"
