"""The README's curl walk-through waits for validation before reading a version (fresh-user round, issue 30: it read
version 1 right after the upload, while validation, which is asynchronous, had not run, and showed "uploaded").

The poll it prints is checked against the API's real answers: the same ``grep`` exits 0 on a ready or rejected
version and 1 while one is uploaded or validating, so the loop neither stops early nor spins forever."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create

README = Path(__file__).resolve().parents[2] / "README.md"
POLL = re.compile(r"until curl -s [^\n]*/versions/(\d+) \\\n\s*\| grep -Eq '([^']+)'; do sleep 1; done")


def _walkthrough() -> str:
    """The README's first ``sh`` block under "Using it" and the versions block after it."""
    text = README.read_text()
    return text[text.index("## Using it"):text.index("## From a training job")]


def test_every_version_read_after_an_upload_waits_for_validation_first() -> None:
    lines = _walkthrough().splitlines()
    for i, line in enumerate(lines):
        if "-F files=@" not in line:
            continue
        number = "1" if "base_model=" in " ".join(lines[i:i + 2]) else "2"
        after = "\n".join(lines[i:])
        poll = POLL.search(after)
        assert poll is not None and poll.group(1) == number, f"no wait for version {number} after the upload"
        read = after.find(f"/versions/{number}\n")
        assert read == -1 or poll.start() < read, f"version {number} is read before the wait"


@pytest.mark.django_db
def test_the_readme_poll_stops_on_ready_or_rejected_only(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    pattern = POLL.search(_walkthrough())
    assert pattern is not None
    client, tenant, _ = make_client()
    adapter = adapter_create(tenant, name="support-bot", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, sha256="1" * 64, size_bytes=1,
                                            s3_prefix="x/", files=[], status="uploaded")
    for status, settled in (("uploaded", False), ("validating", False), ("ready", True), ("rejected", True)):
        AdapterVersion.objects.filter(pk=version.pk).update(status=status)
        answer = client.get("/api/v1/adapters/support-bot/versions/1")
        assert answer.status_code == 200 and answer.json()["status"] == status
        grep = subprocess.run(["grep", "-Eq", pattern.group(2)], input=answer.content, check=False)
        assert (grep.returncode == 0) is settled, (status, answer.content[:200])
