"""Cache behaviour of `demo.assets`: reuse, rebuild on recipe change, one build under concurrency, CLI."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from demo import assets as assets_mod
from demo.assets import MANIFEST_FILE, DemoAssets, ensure_demo_assets, main, recipe_hash
from demo.tasks import TASKS, Example


def _fake_build(calls: list[str]) -> Callable[[Path, str], dict[str, object]]:
    """Return a stand-in for `_build_into` that writes a minimal valid tree and records each call."""

    def build(tmp: Path, served_name: str) -> dict[str, object]:
        calls.append(served_name)
        (tmp / "base").mkdir()
        (tmp / "base" / "model.safetensors").write_bytes(b"fake")
        adapter = tmp / "adapters" / "capitals"
        adapter.mkdir(parents=True)
        (adapter / "adapter_model.safetensors").write_bytes(b"fake")
        (adapter / "examples.json").write_text(json.dumps([{"prompt": "France:", "completion": " Paris"}]))
        return {"base_dir": "base", "adapters": {"capitals": "adapters/capitals"}}

    return build


def test_second_call_reuses_the_cache(demo_assets: DemoAssets) -> None:
    manifest = (demo_assets.root / MANIFEST_FILE).read_text()
    again = ensure_demo_assets(demo_assets.root)
    assert again == demo_assets
    assert (demo_assets.root / MANIFEST_FILE).read_text() == manifest  # no rebuild
    assert json.loads(manifest)["recipe_hash"] == recipe_hash()


def test_manifest_paths_are_relative(demo_assets: DemoAssets) -> None:
    manifest = json.loads((demo_assets.root / MANIFEST_FILE).read_text())
    assert manifest["base_dir"] == "base"
    assert manifest["adapters"] == {name: f"adapters/{name}" for name in TASKS}


def test_stale_recipe_hash_triggers_a_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(assets_mod, "_build_into", _fake_build(calls))
    root = tmp_path / "assets"
    ensure_demo_assets(root)
    ensure_demo_assets(root)
    assert len(calls) == 1
    manifest_path = root / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "recipe_hash": "old"}))
    rebuilt = ensure_demo_assets(root)
    assert len(calls) == 2
    assert json.loads(manifest_path.read_text())["recipe_hash"] == recipe_hash()
    assert rebuilt.examples == {"capitals": [{"prompt": "France:", "completion": " Paris"}]}
    assert not list(tmp_path.glob(".assets.*"))  # no temp or old trees left behind


def test_missing_weights_trigger_a_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(assets_mod, "_build_into", _fake_build(calls))
    root = tmp_path / "assets"
    ensure_demo_assets(root)
    (root / "adapters" / "capitals" / "adapter_model.safetensors").unlink()
    ensure_demo_assets(root)
    assert len(calls) == 2


def test_force_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(assets_mod, "_build_into", _fake_build(calls))
    ensure_demo_assets(tmp_path / "assets")
    ensure_demo_assets(tmp_path / "assets", force=True)
    assert len(calls) == 2


def test_recipe_hash_tracks_tasks_and_served_name(monkeypatch: pytest.MonkeyPatch) -> None:
    before = recipe_hash()
    assert recipe_hash("other-base") != before
    monkeypatch.setitem(TASKS, "capitals", [*TASKS["capitals"], Example("Chile:", " Santiago")])
    assert recipe_hash() != before


def test_recipe_hash_tracks_builder_source(monkeypatch: pytest.MonkeyPatch) -> None:
    before = recipe_hash()
    monkeypatch.setattr(assets_mod, "_BUILDER_SOURCES", ("tasks.py", "tiny_model.py"))
    assert recipe_hash() != before


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = _fake_build(calls)
    gate = threading.Barrier(4)

    def slow_build(tmp: Path, served_name: str) -> dict[str, object]:
        threading.Event().wait(0.3)  # keep the lock held while the other callers arrive
        return fake(tmp, served_name)

    monkeypatch.setattr(assets_mod, "_build_into", slow_build)
    results: list[DemoAssets] = []
    errors: list[BaseException] = []

    def worker() -> None:
        gate.wait()
        try:
            results.append(ensure_demo_assets(tmp_path / "assets"))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(calls) == 1
    assert len(results) == 4 and all(r == results[0] for r in results)


def test_cli_prints_a_summary(demo_assets: DemoAssets, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(demo_assets.root)]) == 0
    out = capsys.readouterr().out
    assert f"--served-model-name {demo_assets.served_name}" in out
    for name in TASKS:
        assert f"adapter {name}: {demo_assets.adapters[name]}" in out
    assert "'France:'→' Paris'" in out
