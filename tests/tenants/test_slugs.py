"""Tenant and adapter names are slugs of single hyphens (served names join them with ``--``); rows named under the
older rule keep working."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from adapters_app.services import adapter_create
from common.exceptions import QuiverError
from tenants.models import Tenant
from tenants.services import limits_set, tenant_create

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("slug", ["a--b", "acme--bot--7", "-acme", "acme-", "-", "Acme", "a_b", "a" * 41, ""])
def test_new_tenant_slugs_with_double_leading_or_trailing_hyphens_are_refused(slug: str) -> None:
    with pytest.raises(ValidationError) as err:
        tenant_create(slug=slug, name="x")
    assert "slug" in err.value.message_dict


@pytest.mark.parametrize("slug", ["a", "a-b", "a1-b2-c3", "0", "a" * 40])
def test_single_hyphen_slugs_pass(slug: str) -> None:
    assert tenant_create(slug=slug, name="x").slug == slug


def test_adapter_names_with_a_double_hyphen_are_refused_naming_the_rule(base_model) -> None:  # type: ignore[no-untyped-def]
    tenant = tenant_create(slug="acme", name="Acme")
    with pytest.raises(QuiverError) as err:
        adapter_create(tenant, name="bot--2", base_model_name="tiny-llama")
    assert err.value.code == "invalid" and "single hyphens" in str(err.value.fields["name"])
    assert adapter_create(tenant, name="bot-2", base_model_name="tiny-llama").name == "bot-2"


def test_a_tenant_named_under_the_old_rule_still_takes_its_limits() -> None:
    legacy = Tenant.objects.create(slug="old--name", name="Legacy")  # created before the rule (no validation)
    limits_set(legacy, limits={"rpm_limit": 60})
    legacy.refresh_from_db()
    assert legacy.rpm_limit == 60
