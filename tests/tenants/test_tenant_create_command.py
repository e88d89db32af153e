"""``manage.py quiver_tenant_create``: stdout is the key alone on its last line (``demo/run.py`` and ``scripts/*``
read ``.splitlines()[-1]``); stderr says what it is; a bad slug is a one-line error naming the field."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from tenants.models import Tenant
from tenants.services import api_key_verify

pytestmark = pytest.mark.django_db


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("quiver_tenant_create", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_stdout_is_the_key_alone_and_stderr_says_what_it_is() -> None:
    out, err = _run("acme", "--name", "Acme")
    key = out.splitlines()[-1]
    assert out == key + "\n"  # $(manage.py quiver_tenant_create acme) captures only the key
    assert api_key_verify(key).tenant.slug == "acme"
    assert "API key 'default' for new tenant acme (shown once; store it now" in err
    assert key not in err

    out, err = _run("acme", "--key-name", "ci")  # an existing tenant: another key
    assert api_key_verify(out.splitlines()[-1]).name == "ci"
    assert "for existing tenant acme" in err and Tenant.objects.filter(slug="acme").count() == 1


def test_a_bad_slug_names_the_field_and_the_rule() -> None:
    with pytest.raises(CommandError, match=r"slug 'Acme--x': Use 1-40 lowercase letters"):
        _run("Acme--x")
    assert not Tenant.objects.exists()


def test_a_key_that_cannot_be_minted_is_a_one_line_error_and_leaves_no_keyless_tenant() -> None:
    with pytest.raises(CommandError, match=r"Key not created: name 'kkkk"):
        _run("acme", "--key-name", "k" * 101)  # ApiKey.name holds 100
    assert not Tenant.objects.exists()
