"""``quiver push`` against the real stack: straight to S3, resumed after a kill at about half, refused locally
before any upload request, rejected by the server with the same codes, CI exit codes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import httpx
import pytest
from quiver_client import Client, QuiverError, push
from quiver_client.training import QuiverPushCallback

from adapters_app import storage
from adapters_app.models import AdapterVersion
from tests.clients.conftest import MIB, QUIVER, Ran, Tenancy, wide_adapter

pytestmark = pytest.mark.django_db(transaction=True)
SERVED = ("adapter_config.json", "adapter_model.safetensors")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version_files(tenancy: Tenancy, name: str, number: int) -> list[tuple[str, int, str]]:
    version = AdapterVersion.objects.get(tenant=tenancy.tenant, adapter__name=name, number=number)
    return sorted((f["name"], f["size"], f["sha256"]) for f in version.files)


def _local_files(folder: Path) -> list[tuple[str, int, str]]:
    return sorted((n, (folder / n).stat().st_size, _sha256(folder / n)) for n in SERVED)


def _upload_requests(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [r for r in seen if "/uploads" in r[1] or (r[0] == "POST" and r[1].endswith("/versions"))]


def test_push_goes_straight_to_s3_waits_for_validation_and_prints_json(
        quiver, tenancy: Tenancy, base_model, tiny_adapters, server_requests, tmp_path: Path) -> None:
    folder = tmp_path / "adapter"
    shutil.copytree(tiny_adapters["qv-r8"], folder)
    (folder / "README.md").write_text("model card: not sent")
    (folder / "training_args.bin").write_bytes(b"pickle: not sent either")
    ran = quiver("push", str(folder), "--name", "support-bot", "--base-model", "tiny-llama", "--json")
    assert ran.rc == 0, ran.stderr
    out = ran.json()
    assert out["status"] == "ready" and out["version"] == 1 and out["resumed"] is False
    assert out["parts_sent"] == out["parts_total"] == 2 and out["parts_skipped"] == 0
    assert out["local_report"]["ok"] is True
    assert _version_files(tenancy, "support-bot", 1) == _local_files(folder)  # only the two served files, as sent
    assert out["sha256"] == AdapterVersion.objects.get(tenant=tenancy.tenant, number=1).sha256
    # The bytes never went through the web process: no through-Django upload, only the direct-upload API.
    assert ("POST", "/api/v1/adapters/support-bot/versions") not in server_requests
    assert ("POST", "/api/v1/adapters/support-bot/uploads") in server_requests

    # The same push again is the same version (identical bytes), found before any upload; the output names it.
    server_requests.clear()
    again = quiver("push", str(folder), "--name", "support-bot")
    assert again.rc == 0, again.stderr
    assert "support-bot@1 ready" in again.stdout and "already uploaded: the same files, nothing sent" in again.stdout
    assert _upload_requests(server_requests) == []
    assert AdapterVersion.objects.filter(tenant=tenancy.tenant).count() == 1


def test_pushing_files_a_version_already_holds_uploads_nothing(
        quiver, tenancy: Tenancy, base_model, tiny_adapters, server_requests) -> None:
    folder = tiny_adapters["qv-r8"]
    assert quiver("push", str(folder), "--name", "bot", "--base-model", "tiny-llama").rc == 0
    assert quiver("push", str(tiny_adapters["all-r16"]), "--name", "bot").rc == 0  # v2, other files
    server_requests.clear()
    again = quiver("--json", "push", str(folder), "--name", "bot", "--base-model", "tiny-llama")
    assert again.rc == 0, again.stderr
    out = again.json()
    v1 = AdapterVersion.objects.get(tenant=tenancy.tenant, adapter__name="bot", number=1)
    assert out["existing"] is True and out["version"] == 1 and out["status"] == "ready" and out["sha256"] == v1.sha256
    assert out["parts_sent"] == 0 and out["upload_id"] == "" and out["version_body"]["number"] == 1
    assert _upload_requests(server_requests) == []  # no upload declared, no part signed, nothing sent to S3
    assert AdapterVersion.objects.filter(tenant=tenancy.tenant).count() == 2

    # Another base model named for the same files: not the existing version, the server's refusal instead.
    other = quiver("push", str(folder), "--name", "bot", "--base-model", "other-base", "--no-local-check")
    assert other.rc != 0 and "existing" not in other.stdout

    # A rejected version with the same files is sent again (the server validates it anew), not answered as is.
    AdapterVersion.objects.filter(pk=v1.pk).update(status="rejected")
    resent = quiver("--json", "push", str(folder), "--name", "bot")
    assert resent.json()["existing"] is False and resent.json()["version"] == 1, resent.stderr


def test_an_archive_is_checked_unpacked_and_sent_as_its_two_files(quiver, tenancy: Tenancy, base_model,
                                                                   tiny_adapters, tmp_path: Path) -> None:
    folder = tiny_adapters["all-r16"]
    archive = tmp_path / "adapter.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in SERVED:
            tar.add(folder / name, arcname=f"checkpoint/{name}")
    ran = quiver("push", str(archive), "--name", "from-archive", "--base-model", "tiny-llama", "--json")
    assert ran.rc == 0, ran.stderr
    assert ran.json()["status"] == "ready"
    assert _version_files(tenancy, "from-archive", 1) == _local_files(folder)


def test_a_local_validation_failure_exits_3_before_any_upload_request(
        quiver, tenancy: Tenancy, base_model, tiny_adapters, server_requests, tmp_path: Path) -> None:
    # Stage 1, offline: a missing weights file costs no request at all.
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(tiny_adapters["qv-r8"] / "adapter_config.json", no_weights)
    (no_weights / "adapter_model.bin").write_bytes(b"\x80\x02pickle")
    ran = quiver("push", str(no_weights), "--name", "bad", "--base-model", "tiny-llama")
    assert ran.rc == 3
    assert "pickle_weights" in ran.stderr and "safe_serialization=True" in ran.stderr  # the server's own hint
    assert "Local validation failed, nothing was uploaded" in ran.stderr
    assert server_requests == []

    # Stage 2, with the base model's facts: rank 32 over the pool's 16, the validator's adapter_rank_too_high.
    too_high = tmp_path / "too-high"
    shutil.copytree(tiny_adapters["qv-r8"], too_high)
    config = (too_high / "adapter_config.json").read_text()
    (too_high / "adapter_config.json").write_text(re.sub(r'"r": \d+', '"r": 32', config))
    ran = quiver("push", str(too_high), "--name", "bad", "--base-model", "tiny-llama", "--json")
    assert ran.rc == 3
    report = ran.json()
    assert report["where"] == "local" and "adapter_rank_too_high" in {p["code"] for p in report["report"]["problems"]}
    assert _upload_requests(server_requests) == []  # counted at the server: only reads (base models) happened
    assert all(method == "GET" for method, _ in server_requests)
    assert storage.multipart_uploads(f"tenants/{tenancy.tenant.pk}/") == []

    # The server's validator gives the same code when the local check is skipped.
    ran = quiver("push", str(too_high), "--name", "bad", "--base-model", "tiny-llama", "--no-local-check", "--json")
    assert ran.rc == 3
    server = ran.json()
    assert server["where"] == "server"
    assert {p["code"] for p in server["report"]["problems"] if p["severity"] == "error"} == {
        p["code"] for p in report["report"]["problems"] if p["severity"] == "error"}


def test_a_name_the_server_refuses_exits_2_with_the_rule_before_any_file_is_read(
        quiver, tenancy: Tenancy, tiny_adapters, server_requests, tmp_path: Path) -> None:
    """`--name "support bot"` hashed every file and asked the server before it was refused."""
    rule = ("'support bot' is not an adapter name: use 1-40 lowercase letters, digits or single hyphens, starting "
            "and ending with a letter or digit (e.g. support-bot).")
    ran = quiver("push", str(tiny_adapters["qv-r8"]), "--name", "support bot", "--base-model", "tiny-llama")
    assert ran.rc == 2, ran.stderr
    assert " ".join(ran.stderr.split()).endswith("argument --name: " + rule)
    assert "hashing" not in ran.stderr and server_requests == []
    # The library checks first too (the training callback at once, before a run it would waste).
    unreadable = tmp_path / "unreadable"  # a folder push would fail to read: the name is refused before that
    with Client(tenancy.url, tenancy.key) as client, pytest.raises(QuiverError) as refused:
        push(client, unreadable, name="support--bot", base_model="tiny-llama")
    assert (refused.value.code, refused.value.exit_code) == ("invalid_name", 2)
    assert "'support--bot' is not an adapter name" in str(refused.value)
    with pytest.raises(QuiverError, match="'Support' is not an adapter name"):
        QuiverPushCallback("Support", base_model="tiny-llama")
    assert server_requests == []


def test_push_errors_are_one_line_with_the_fix(quiver, tenancy: Tenancy, base_model, tiny_adapters) -> None:
    folder = str(tiny_adapters["qv-r8"])
    ran = quiver("push", folder, "--name", "new-one")
    assert ran.rc == 1 and "does not exist yet; pass --base-model" in ran.stderr
    ran = quiver("push", folder, "--name", "new-one", "--base-model", "gpt-9")
    assert ran.rc == 1 and "Unknown base model 'gpt-9'" in ran.stderr and "tiny-llama" in ran.stderr
    ran = quiver("push", folder + "-nope", "--name", "new-one", "--base-model", "tiny-llama")
    assert ran.rc == 1 and "does not exist" in ran.stderr
    wrong = tenancy.key.rsplit(".", 1)[0] + ".not-the-secret"
    ran = quiver("push", folder, "--name", "new-one", "--base-model", "tiny-llama",
                 env=tenancy.env(QUIVER_API_KEY=wrong))
    assert ran.rc == 1 and "quiver login" in ran.stderr and "HTTP 401" in ran.stderr
    assert "not-the-secret" not in ran.stderr and tenancy.key.rsplit(".", 1)[1] not in ran.stderr
    # Progress lines come first on stderr; the error is the one last line.
    assert [line for line in ran.stderr.splitlines() if "error" in line] == [ran.stderr.strip().splitlines()[-1]]


def test_a_push_killed_at_half_resumes_sending_only_the_missing_parts(
        tenancy: Tenancy, wide_base, settings, tmp_path: Path) -> None:
    settings.QUIVER_UPLOAD_PART_BYTES = 5 * MIB  # S3's smallest part: ten parts for the ~48 MiB adapter
    folder = wide_adapter(tmp_path / "wide")
    weights = folder / "adapter_model.safetensors"
    assert weights.stat().st_size > 45 * MIB
    total = 1 + -(-weights.stat().st_size // (5 * MIB))  # the config's one part, then the weights'
    argv = [str(QUIVER), "push", str(folder), "--name", "wide", "--base-model", "wide-llama", "--parallel", "1"]
    proc = subprocess.Popen(argv, env=tenancy.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # one line per stored part: kill on the first at or past 50 %
            lines.append(line)
            match = re.search(r"\((\d+)%\)", line)
            if match and int(match[1]) >= 50:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert any(f"uploading {total} of {total} parts" in line for line in lines), lines
    with Client(tenancy.url, tenancy.key) as client:
        state = next((tenancy.home / "state" / "uploads").glob("*.json"))
        upload_id = json.loads(state.read_text())["upload_id"]
        stored = client.upload_parts("wide", upload_id)
        assert total // 2 <= len(stored) < total, stored  # about half: what was stored before the kill

        puts: list[str] = []

        class Counting(httpx.HTTPTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                if request.method == "PUT":
                    puts.append(request.url.params["partNumber"])
                return super().handle_request(request)

        result = push(client, folder, name="wide", base_model="wide-llama", state_folder=tenancy.home / "state",
                      s3_transport=Counting())
    assert result.resumed and result.upload_id == upload_id
    assert len(puts) == total - len(stored) == result.parts_sent  # only the missing parts went out again
    assert result.parts_skipped == len(stored)
    held = {(p["name"], p["PartNumber"]) for p in stored}
    assert not held & {("adapter_model.safetensors", int(n)) for n in puts}
    assert result.status == "ready"
    assert _version_files(tenancy, "wide", 1) == _local_files(folder)  # sha256 of every file matches


def test_no_wait_returns_once_uploaded(quiver, tenancy: Tenancy, base_model, tiny_adapters) -> None:
    ran: Ran = quiver("push", str(tiny_adapters["qv-r8"]), "--name", "quick", "--base-model", "tiny-llama",
                      "--no-wait", "--json")
    assert ran.rc == 0, ran.stderr
    out = ran.json()
    assert out["upload_id"] and out["parts_sent"] == 2
    assert out["status"] in ("verifying", "uploaded", "validating", "ready", "done")
