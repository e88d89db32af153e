"""The validation service: downloads the stored files, runs the validator, records status and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_version_upload, adapter_version_validate

pytestmark = pytest.mark.django_db


def _upload(tenant, folder: Path, *, weights: bytes | None = None, name: str = "a") -> AdapterVersion:  # type: ignore[no-untyped-def]
    files = [
        SimpleUploadedFile("adapter_config.json", (folder / "adapter_config.json").read_bytes()),
        SimpleUploadedFile("adapter_model.safetensors",
                           weights if weights is not None else (folder / "adapter_model.safetensors").read_bytes()),
    ]
    version, _ = adapter_version_upload(tenant, adapter_name=name, upload_files=files, base_model_name="tiny-llama")
    return version


def test_valid_adapter_becomes_ready_with_peft_facts(make_client, base_model, tiny_adapters) -> None:
    _, tenant, _ = make_client()
    version = adapter_version_validate(_upload(tenant, tiny_adapters["qv-r8"]))
    assert version.status == AdapterVersion.Status.READY, version.validation_report
    assert version.r == 8 and version.lora_alpha == 16
    assert sorted(version.target_modules) == ["q_proj", "v_proj"]
    assert version.validation_report["ok"] is True
    # Idempotent: a second run changes nothing.
    assert adapter_version_validate(version).validated_at == version.validated_at


def test_truncated_safetensors_is_rejected_with_a_readable_reason(make_client, base_model, tiny_adapters) -> None:
    _, tenant, _ = make_client()
    weights = (tiny_adapters["qv-r8"] / "adapter_model.safetensors").read_bytes()
    version = adapter_version_validate(_upload(tenant, tiny_adapters["qv-r8"], weights=weights[: len(weights) // 2]))
    assert version.status == AdapterVersion.Status.REJECTED
    problems = version.validation_report["problems"]
    assert problems and all(p["message"] and p["hint"] for p in problems)
    assert any("truncat" in p["code"] or "truncat" in p["message"].lower() for p in problems), problems


def test_rank_above_pool_limit_is_rejected_naming_the_setting(make_client, base_model, tiny_adapters) -> None:
    _, tenant, _ = make_client()
    base_model.max_lora_rank = 8
    base_model.save()
    version = adapter_version_validate(_upload(tenant, tiny_adapters["all-r16"]))
    assert version.status == AdapterVersion.Status.REJECTED
    codes = {p["code"]: p for p in version.validation_report["problems"]}
    assert "adapter_rank_too_high" in codes
    assert "max_lora_rank" in codes["adapter_rank_too_high"]["hint"] + codes["adapter_rank_too_high"]["message"]


def test_report_is_returned_by_the_api(make_client, base_model, tiny_adapters) -> None:
    client, tenant, _ = make_client()
    version = adapter_version_validate(_upload(tenant, tiny_adapters["qv-r8"], name="shown"))
    body = client.get(f"/api/v1/adapters/shown/versions/{version.number}").json()
    assert body["status"] == "ready"
    assert body["validation_report"]["ok"] is True and "facts" in body["validation_report"]


def test_versions_are_immutable(make_client, base_model, tiny_adapters) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    version = _upload(tenant, tiny_adapters["qv-r8"])
    version.sha256 = "0" * 64
    with pytest.raises(ValueError, match="immutable"):
        version.save()
    with pytest.raises(ValueError, match="immutable"):
        version.save(update_fields=["sha256"])
    version.refresh_from_db()
    version.status = AdapterVersion.Status.VALIDATING
    version.save(update_fields=["status"])


@pytest.mark.parametrize("extra", [{"r": 2**31}, {"lora_alpha": 10**400}, {"rank_pattern": {"q_proj": 10**400}}])
def test_out_of_range_numbers_are_rejected_not_stuck(make_client, base_model, tiny_adapters, tmp_path, extra) -> None:  # type: ignore[no-untyped-def]
    _, tenant, _ = make_client()
    config = {**json.loads((tiny_adapters["qv-r8"] / "adapter_config.json").read_text()), **extra}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    (tmp_path / "adapter_model.safetensors").write_bytes(
        (tiny_adapters["qv-r8"] / "adapter_model.safetensors").read_bytes())
    version = adapter_version_validate(_upload(tenant, tmp_path))
    assert version.status == AdapterVersion.Status.REJECTED
    assert "config_invalid_field" in {p["code"] for p in version.validation_report["problems"]}
