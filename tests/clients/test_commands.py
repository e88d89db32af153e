"""Every ``quiver`` command but ``push`` against the real stack, ``--json`` asserted, plus login's config file."""

from __future__ import annotations

import csv
import io
import os
import stat

import pytest
from quiver_client.config import mask_key

from adapters_app.models import Adapter
from tenants.models import ApiKey
from tests.clients.conftest import Tenancy

pytestmark = pytest.mark.django_db(transaction=True)


def test_adapters_and_versions_listings(quiver, tenancy: Tenancy, base_model, tiny_adapters) -> None:
    empty = quiver("adapters", "ls", "--json")
    assert empty.rc == 0 and empty.json() == []
    assert "No adapters yet" in quiver("adapters", "ls").stderr
    for folder in ("qv-r8", "all-r16"):
        assert quiver("push", str(tiny_adapters[folder]), "--name", "bot", "--base-model", "tiny-llama").rc == 0

    listed = quiver("adapters", "ls", "--json")
    assert listed.rc == 0
    [bot] = listed.json()
    # v2 is ready but takes no traffic until promoted (docs/versions.md): v1 serves.
    assert bot["name"] == "bot" and bot["base_model"] == "tiny-llama" and bot["serving_version"] == 1
    assert bot["latest_version"]["number"] == 2 and bot["latest_version"]["status"] == "ready"
    table = quiver("adapters", "ls").stdout
    assert "bot" in table and "tiny-llama" in table and "v2 ready" in table

    versions = quiver("versions", "ls", "bot", "--json")
    assert versions.rc == 0
    assert [(v["number"], v["status"]) for v in versions.json()] == [(2, "ready"), (1, "ready")]
    assert "ready" in quiver("versions", "ls", "bot").stdout

    shown = quiver("versions", "show", "bot@1", "--json")
    assert shown.rc == 0
    body = shown.json()
    assert body["number"] == 1 and body["r"] == 8 and body["validation_report"]["ok"] is True
    newest = quiver("versions", "show", "bot", "--json").json()
    assert newest["number"] == 2 and newest["r"] == 16
    human = quiver("versions", "show", "bot@2").stdout
    assert "bot@2" in human and "ready" in human and newest["sha256"] in human

    missing = quiver("versions", "show", "bot@9")
    assert missing.rc == 1 and "HTTP 404" in missing.stderr
    bad_ref = quiver("versions", "show", "bot@latest")
    assert bad_ref.rc == 2 and "NAME@N" in bad_ref.stderr
    unknown = quiver("versions", "ls", "bot3")  # it printed "Not found."
    assert unknown.rc == 1
    assert " ".join(unknown.stderr.split()) == ("quiver: error (not_found, HTTP 404): No adapter 'bot3' in this tenant; "
                                                "`quiver adapters ls` (GET /api/v1/adapters) lists yours.")
    missing = quiver("versions", "show", "bot@9")
    assert "Adapter 'bot' has no version 9; `quiver versions ls bot` lists them." in " ".join(missing.stderr.split())


def test_delete(quiver, tenancy: Tenancy, base_model, tiny_adapters) -> None:
    assert quiver("push", str(tiny_adapters["qv-r8"]), "--name", "doomed", "--base-model", "tiny-llama").rc == 0
    unconfirmed = quiver("delete", "doomed")
    assert unconfirmed.rc == 1 and "--yes" in unconfirmed.stderr
    assert Adapter.objects.filter(tenant=tenancy.tenant, name="doomed").exists()
    deleted = quiver("delete", "doomed", "--yes", "--json")
    assert deleted.rc == 0 and deleted.json() == {"deleted": "doomed"}
    assert quiver("adapters", "ls", "--json").json() == []
    again = quiver("delete", "doomed", "--yes")
    assert again.rc == 1 and "HTTP 404" in again.stderr


def test_keys_create_ls_revoke(quiver, tenancy: Tenancy) -> None:
    created = quiver("keys", "create", "ci-reader", "--scope", "adapters:read", "--json")
    assert created.rc == 0, created.stderr
    key = created.json()
    assert key["name"] == "ci-reader" and key["scopes"] == ["adapters:read"] and key["secret"].startswith("qv_")
    plain = quiver("keys", "create", "ci-writer")
    assert plain.rc == 0 and plain.stdout.strip().startswith("qv_") and "shown this once" in plain.stderr
    assert len(plain.stdout.strip().splitlines()) == 1  # stdout: the key alone, for $(quiver keys create …)

    # The new read-only key works for reads and is refused a write, with the fix named.
    reader = tenancy.env(QUIVER_API_KEY=key["secret"])
    assert quiver("adapters", "ls", "--json", env=reader).rc == 0
    refused = quiver("keys", "create", "x", env=reader)
    assert refused.rc == 1 and "HTTP 403" in refused.stderr

    listed = quiver("keys", "ls", "--json")
    assert listed.rc == 0
    rows = {r["key_id"]: r for r in listed.json()}
    assert {"ci-reader", "ci-writer", "cli"} <= {r["name"] for r in rows.values()}
    assert all("secret" not in r for r in rows.values())
    table = quiver("keys", "ls").stdout
    assert key["secret"] not in table and key["key_id"] in table

    revoked = quiver("keys", "revoke", key["key_id"], "--json")
    assert revoked.rc == 0 and revoked.json()["revoked_at"] is not None
    assert ApiKey.objects.get(key_id=key["key_id"]).revoked_at is not None
    gone = quiver("adapters", "ls", env=reader)
    assert gone.rc == 1 and "quiver login" in gone.stderr and key["secret"] not in gone.stderr + gone.stdout
    assert "revoked" in quiver("keys", "ls").stdout
    unknown = quiver("keys", "revoke", "0123456789ab")
    assert unknown.rc == 1 and "No key '0123456789ab' in this tenant; `quiver keys ls`" in unknown.stderr


def test_a_key_limited_to_adapters_says_so_when_made_and_listed(quiver, tenancy: Tenancy) -> None:
    made = quiver("keys", "create", "bot-app", "--adapter", "support-bot")
    assert made.rc == 0 and "only support-bot" in made.stderr, made.stderr
    assert "No adapter or version support-bot exists yet" in made.stderr  # none uploaded: a typo would read the same
    assert made.stdout.strip().count("\n") == 0  # stdout stays the key alone
    assert "support-bot" in quiver("keys", "ls").stdout


def test_usage_json_and_csv_shapes(quiver, tenancy: Tenancy) -> None:
    # Real traffic's rows are asserted in test_chat.py; here: a fresh tenant's empty range in each format.
    rows = quiver("usage", "--since", "1h", "--json")
    assert rows.rc == 0 and rows.json() == []
    exported = quiver("usage", "--since", "7d", "--until", "2999-01-01T00:00:00Z", "--csv")
    assert exported.rc == 0
    assert "model" in next(csv.reader(io.StringIO(exported.stdout)))
    assert "No usage in this range" in quiver("usage", "--since", "2999-01-01").stderr
    bad = quiver("usage", "--since", "yesterday-ish")
    assert bad.rc == 2 and "ISO 8601" in bad.stderr


def test_login_stores_the_key_0600_and_commands_use_it(quiver, tenancy: Tenancy) -> None:
    bare = {k: v for k, v in tenancy.env().items() if k not in ("QUIVER_URL", "QUIVER_API_KEY")}
    none = quiver("adapters", "ls", env=bare)
    assert none.rc == 1 and "quiver login" in none.stderr

    wrong = quiver("login", "--url", tenancy.url, "--api-key-stdin", env=bare, stdin="qv_nope.nope\n")
    assert wrong.rc == 1 and "HTTP 401" in wrong.stderr and "nope.nope" not in wrong.stderr
    ok = quiver("login", "--url", tenancy.url, "--api-key-stdin", env=bare, stdin=tenancy.key + "\n")
    assert ok.rc == 0, ok.stderr
    assert mask_key(tenancy.key) in ok.stderr and tenancy.key not in ok.stderr + ok.stdout
    path = tenancy.home / ".config" / "quiver" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert quiver("adapters", "ls", "--json", env=bare).json() == []

    os.chmod(path, 0o644)
    unsafe = quiver("adapters", "ls", env=bare)
    assert unsafe.rc == 1 and "chmod 600" in unsafe.stderr
    os.chmod(path, 0o600)
    assert quiver("logout", env=bare).rc == 0
    assert quiver("adapters", "ls", env=bare).rc == 1


def test_unreachable_server_is_one_line(quiver, tenancy: Tenancy) -> None:
    ran = quiver("adapters", "ls", "--url", "http://127.0.0.1:9")
    assert ran.rc == 1 and "Cannot reach Quiver at http://127.0.0.1:9" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
