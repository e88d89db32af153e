"""check_upload_names: rules for multipart uploads of loose files."""

from __future__ import annotations

import pytest

from adapters_app.validation import UploadRejected, check_upload_names


def _codes(names: list[str]) -> list[str]:
    with pytest.raises(UploadRejected) as info:
        check_upload_names(names)
    assert all(p.severity == "error" for p in info.value.problems)
    return info.value.codes


def test_plain_adapter_accepted() -> None:
    check_upload_names(["adapter_config.json", "adapter_model.safetensors", "README.md", ".DS_Store"])


@pytest.mark.parametrize(
    "bad", ["../adapter_model.safetensors", "a/adapter_config.json", "a\\b", "..", "", "x\x00y"]
)
def test_path_like_names_rejected(bad: str) -> None:
    codes = _codes(["adapter_config.json", "adapter_model.safetensors", bad])
    assert codes == ["upload_bad_filename"]


@pytest.mark.parametrize("pickle_name", ["adapter_model.bin", "adapter_model.pt", "weights.PTH", "x.pkl"])
def test_pickle_rejected_with_conversion_hint(pickle_name: str) -> None:
    with pytest.raises(UploadRejected) as info:
        check_upload_names(["adapter_config.json", pickle_name])
    (problem,) = info.value.problems
    assert problem.code == "pickle_weights"
    assert problem.field == pickle_name
    assert "safe_serialization=True" in problem.hint and "save_file" in problem.hint


def test_pickle_next_to_safetensors_still_rejected() -> None:
    assert _codes(["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]) == [
        "pickle_weights"
    ]


def test_missing_files_each_named() -> None:
    assert _codes(["README.md"]) == ["missing_adapter_config", "missing_adapter_weights"]


def test_renamed_safetensors_is_mentioned() -> None:
    with pytest.raises(UploadRejected) as info:
        check_upload_names(["adapter_config.json", "model.safetensors"])
    (problem,) = info.value.problems
    assert problem.code == "missing_adapter_weights" and "model.safetensors" in problem.message


def test_duplicate_upload_name() -> None:
    assert _codes(["adapter_config.json", "adapter_config.json", "adapter_model.safetensors"]) == [
        "upload_duplicate_name"
    ]


@pytest.mark.parametrize("stray", ["padding.bin", "adapter_model.bin"])
def test_a_stray_pickle_next_to_safetensors_says_remove_it_not_convert(stray: str) -> None:
    with pytest.raises(UploadRejected) as info:
        check_upload_names(["adapter_config.json", "adapter_model.safetensors", stray])
    (problem,) = info.value.problems
    assert problem.code == "pickle_weights" and problem.field == stray
    assert f"Remove {stray}" in problem.hint and "nothing needs converting" in problem.hint
    assert "save_file" not in problem.hint and "already holds the weights" in problem.message
