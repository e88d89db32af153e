"""Settings and secrets: entry points default to production, which has no secret defaults and refuses placeholders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from config.settings.base import read_secret
from tenants.services import api_key_create, api_key_verify
from tests.factories import TenantFactory

REPO = Path(__file__).resolve().parents[2]
GOOD = {
    "DJANGO_SECRET_KEY": "s" * 50,
    "QUIVER_API_KEY_HMAC_KEY": "h" * 40,
    "QUIVER_NODE_SECRET": "n" * 40,
    "DATABASE_URL": "postgres://quiver:a-real-password@127.0.0.1:1/quiver",
    "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
}


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("entry", ["config.asgi", "config.wsgi", "workers.celery_app", "manage"])
def test_every_entry_point_defaults_to_production(entry: str) -> None:
    code = ("import runpy, sys; sys.argv = ['manage.py', 'check']; runpy.run_path('manage.py', run_name='__main__')"
            if entry == "manage" else
            f"import {entry}; from django.conf import settings; settings.SECRET_KEY")
    done = _python(code)
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY, QUIVER_API_KEY_HMAC_KEY" in done.stderr and "are not set" in done.stderr, (
        done.stderr[-2000:])


@pytest.mark.parametrize(("unset", "named"), [
    (tuple(GOOD), "DJANGO_SECRET_KEY, QUIVER_API_KEY_HMAC_KEY, QUIVER_NODE_SECRET, DATABASE_URL, CELERY_BROKER_URL are"),
    (("DATABASE_URL",), "DATABASE_URL is not set"),
])
def test_manage_py_without_the_environment_says_so_in_one_line(unset: tuple[str, ...], named: str) -> None:
    env = {k: v for k, v in GOOD.items() if k not in unset}
    done = subprocess.run([sys.executable, "manage.py", "migrate"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                         "HOME": os.environ.get("HOME", "/tmp"), **env})
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"manage.py: {named}"), done.stderr
    assert "README" in done.stderr and "DJANGO_SETTINGS_MODULE=config.settings.local" in done.stderr


def test_manage_py_still_takes_settings_on_its_command_line() -> None:
    done = subprocess.run([sys.executable, "manage.py", "check", "--settings=config.settings.local"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")})
    assert done.returncode == 0 and "no issues" in done.stdout, done.stderr


def test_manage_py_names_a_placeholder_secret_in_one_line() -> None:
    env = {**GOOD, "QUIVER_NODE_SECRET": "CHANGE-ME-node-secret"}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                         "HOME": os.environ.get("HOME", "/tmp"), **env})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("manage.py: QUIVER_NODE_SECRET is a placeholder"), done.stderr


def test_production_starts_with_real_secrets() -> None:
    done = _python("import os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings.production'; import django; "
                   "django.setup(); from django.conf import settings; print(settings.DEBUG, settings.X_FRAME_OPTIONS)",
                   **GOOD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "DENY"]


@pytest.mark.parametrize(("name", "value", "message"), [
    ("DJANGO_SECRET_KEY", "CHANGE-ME-long-random-string", "DJANGO_SECRET_KEY is a placeholder"),
    ("QUIVER_NODE_SECRET", "CHANGE-ME-node-key", "QUIVER_NODE_SECRET is a placeholder"),
    ("QUIVER_NODE_SECRET", "dev-node-key", "QUIVER_NODE_SECRET is a placeholder"),
    ("QUIVER_API_KEY_HMAC_KEY", "s" * 50, "must differ from DJANGO_SECRET_KEY"),
    ("DATABASE_URL", "postgres://q:CHANGE-ME-postgres-password@db:5432/q", "DATABASE_URL password is a placeholder"),
])
def test_production_refuses_placeholders_and_reused_secrets(name: str, value: str, message: str) -> None:
    done = _python("import os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings.production'; import django; "
                   "django.setup()", **{**GOOD, name: value})
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_read_secret_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUIVER_TEST_SECRET", raising=False)
    with pytest.raises(ImproperlyConfigured, match="QUIVER_TEST_SECRET is not set"):
        read_secret("QUIVER_TEST_SECRET")
    assert read_secret("QUIVER_TEST_SECRET", dev_default="dev-insecure-x") == "dev-insecure-x"
    monkeypatch.setenv("QUIVER_TEST_SECRET", "short")
    with pytest.raises(ImproperlyConfigured, match="has 5 characters; use at least 32"):
        read_secret("QUIVER_TEST_SECRET")
    monkeypatch.setenv("QUIVER_TEST_SECRET", "changeme" * 8)
    with pytest.raises(ImproperlyConfigured, match="placeholder"):
        read_secret("QUIVER_TEST_SECRET", dev_default="other")


@pytest.mark.django_db
def test_rotating_secret_key_keeps_api_keys_valid() -> None:
    _, plaintext = api_key_create(TenantFactory(), name="k")
    with override_settings(SECRET_KEY="rotated-" + "x" * 50):
        assert api_key_verify(plaintext).name == "k"
    with override_settings(QUIVER_API_KEY_HMAC_KEY="another-" + "y" * 40), pytest.raises(Exception, match="unknown"):
        api_key_verify(plaintext)


def test_the_asgi_servers_pool_database_connections_and_other_processes_do_not() -> None:
    show = ("import json; from django.conf import settings; "
            "print(json.dumps(settings.DATABASES['default']['OPTIONS'].get('pool')))")
    env = {**GOOD, "DJANGO_SETTINGS_MODULE": "config.settings.production"}
    for entry in ("config.asgi", "config.internal_asgi"):
        served = _python(f"import {entry}; {show}", **env)
        assert served.returncode == 0, served.stderr[-2000:]
        pool = json.loads(served.stdout.strip().splitlines()[-1])
        assert pool["max_size"] == 16 and pool["timeout"] <= 5 and pool["reconnect_timeout"] <= 5, pool
    worker = _python(f"import django; django.setup(); {show}", **env)  # Celery's prefork children, commands
    assert worker.returncode == 0 and worker.stdout.split() == ["null"], worker.stderr[-2000:]
