"""Cached demo assets: build the tiny base model and train the task adapters once, reuse afterwards.

Layout under the root (default `<repo>/.cache/demo-assets`, git-ignored)::

    manifest.json            recipe version + hash, relative paths, timings
    base/                    HF model folder (serve with --served-model-name tiny-llama)
    adapters/<task>/         PEFT adapter + examples.json + training.json

A build happens only if the manifest is missing or its recipe hash differs (the hash covers the
model/task/training parameters and the builder modules' source). It runs under a file lock
(`<root>.lock`), writes into a temporary sibling folder and renames it into place, so concurrent callers
(pytest workers, a Celery worker and a test session) never see a half-written tree.

CLI: `python -m demo.assets [--out DIR] [--force]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from demo import tiny_model
from demo.tasks import TASKS
from demo.tiny_model import DEFAULT_SERVED_NAME, build_base_model
from demo.train_adapters import EXAMPLES_FILE, TrainConfig, train_all

# Bump to force every cache to rebuild (e.g. after a library upgrade changes the bytes).
RECIPE_VERSION = 2
SEED = 0
MANIFEST_FILE = "manifest.json"
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / ".cache" / "demo-assets"
# The builder's own code is part of the recipe: a rebuild costs seconds, a stale cache costs a confusing demo.
_BUILDER_SOURCES = ("tasks.py", "tiny_model.py", "train_adapters.py")


@dataclass(frozen=True)
class DemoAssets:
    """Paths and data of a built asset tree.

    Attributes:
        root: The asset root.
        base_dir: HF model folder for vLLM's `--model`.
        served_name: Name to pass as `--served-model-name`; every adapter's `base_model_name_or_path`.
        adapters: Task name → adapter folder (for `/v1/load_lora_adapter`'s `lora_path`).
        examples: Task name → `[{"prompt": ..., "completion": ...}]`; greedy completion of each prompt
            with that adapter equals `completion` exactly (then EOS).
    """

    root: Path
    base_dir: Path
    served_name: str
    adapters: dict[str, Path]
    examples: dict[str, list[dict[str, str]]]


def recipe(served_name: str = DEFAULT_SERVED_NAME) -> dict[str, object]:
    """Return everything that determines the built bytes, as JSON-serialisable data.

    Args:
        served_name: Served name recorded in the base folder and in each adapter config.
    """
    train = asdict(TrainConfig())
    train["target_modules"] = list(train["target_modules"])
    return {
        "version": RECIPE_VERSION,
        "seed": SEED,
        "served_name": served_name,
        "base": tiny_model.recipe(),
        "tasks": {name: [ex.as_dict() for ex in examples] for name, examples in TASKS.items()},
        "train": train,
        "sources": {
            name: hashlib.sha256((Path(__file__).parent / name).read_bytes()).hexdigest()
            for name in _BUILDER_SOURCES
        },
    }


def recipe_hash(served_name: str = DEFAULT_SERVED_NAME) -> str:
    """Return the sha256 hex digest of the canonical JSON of `recipe(served_name)`."""
    blob = json.dumps(recipe(served_name), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _load(root: Path, expected_hash: str) -> DemoAssets | None:
    """Return the assets under `root` if its manifest matches `expected_hash` and all paths exist."""
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return None
    if manifest.get("recipe_hash") != expected_hash:
        return None
    base_dir = root / manifest["base_dir"]
    adapters = {name: root / rel for name, rel in manifest["adapters"].items()}
    if not (base_dir / "model.safetensors").is_file():
        return None
    if not all((path / "adapter_model.safetensors").is_file() for path in adapters.values()):
        return None
    examples = {name: json.loads((path / EXAMPLES_FILE).read_text()) for name, path in adapters.items()}
    return DemoAssets(root, base_dir, manifest["served_name"], adapters, examples)


def _build_into(tmp: Path, served_name: str) -> dict[str, object]:
    """Build the base model and adapters into `tmp`; return manifest fields (timings, relative paths)."""
    started = time.perf_counter()
    build_base_model(tmp / "base", served_name=served_name, seed=SEED)
    base_seconds = time.perf_counter() - started
    results = train_all(tmp / "base", tmp / "adapters")
    return {
        "base_dir": "base",
        "adapters": {name: f"adapters/{name}" for name in results},
        "base_build_seconds": round(base_seconds, 3),
        "train_loop_seconds": round(sum(r.seconds for r in results.values()), 3),
        "total_build_seconds": round(time.perf_counter() - started, 3),
        "training": {
            name: {"steps": r.steps, "min_margin": round(r.min_margin, 3)} for name, r in results.items()
        },
    }


def _swap_in(tmp: Path, root: Path) -> None:
    """Replace `root` by `tmp` with renames, so `root` is never a half-written tree."""
    if root.exists():
        old = root.with_name(f".{root.name}.old-{os.getpid()}")
        root.rename(old)
        tmp.rename(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(root)


def ensure_demo_assets(
    root: Path | None = None, *, served_name: str = DEFAULT_SERVED_NAME, force: bool = False
) -> DemoAssets:
    """Return the demo assets under `root`, building them first if missing or stale.

    Idempotent and safe across processes: a file lock next to `root` serialises builders, and the
    tree is built in a temporary sibling folder and renamed into place.

    Args:
        root: Asset root; defaults to `<repo>/.cache/demo-assets`.
        served_name: Served name of the base model (part of the recipe hash).
        force: Rebuild even if the cached tree matches.

    Returns:
        The built assets.

    Raises:
        RuntimeError: If training fails its stopping rule (see `demo.train_adapters.train_adapter`).
    """
    root = (root or DEFAULT_ROOT).resolve()
    expected = recipe_hash(served_name)
    if not force and (found := _load(root, expected)) is not None:
        return found
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.with_name(f"{root.name}.lock"))):
        # Another process may have built it while we waited for the lock.
        if not force and (found := _load(root, expected)) is not None:
            return found
        tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            fields = _build_into(tmp, served_name)
            manifest = {
                "recipe_version": RECIPE_VERSION,
                "recipe_hash": expected,
                "served_name": served_name,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **fields,
            }
            # Written last: a manifest in the tree means the tree is complete.
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
            _swap_in(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        loaded = _load(root, expected)
    if loaded is None:
        raise RuntimeError(f"demo assets at {root} are incomplete right after building")
    return loaded


def _summary(assets: DemoAssets) -> str:
    manifest = json.loads((assets.root / MANIFEST_FILE).read_text())
    lines = [
        f"demo assets: {assets.root}",
        f"  recipe v{manifest['recipe_version']} {manifest['recipe_hash'][:12]} built {manifest['built_at']}"
        f" in {manifest['total_build_seconds']}s (training loops {manifest['train_loop_seconds']}s)",
        f"  base: {assets.base_dir}  (--model {assets.base_dir} --served-model-name {assets.served_name})",
    ]
    for name, path in assets.adapters.items():
        stats = manifest["training"][name]
        shown = ", ".join(f"{ex['prompt']!r}→{ex['completion']!r}" for ex in assets.examples[name][:3])
        lines.append(f"  adapter {name}: {path}")
        lines.append(
            f"    {len(assets.examples[name])} examples, {stats['steps']} steps, "
            f"min logit margin {stats['min_margin']}; e.g. {shown}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build (if needed) and print a summary.

    Args:
        argv: Arguments without the program name; defaults to `sys.argv[1:]`.

    Returns:
        Process exit status (0).
    """
    parser = argparse.ArgumentParser(prog="python -m demo.assets", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_ROOT, help="asset root (default: %(default)s)")
    parser.add_argument("--served-name", default=DEFAULT_SERVED_NAME, help="base model's served name")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cache is current")
    args = parser.parse_args(argv)
    assets = ensure_demo_assets(args.out, served_name=args.served_name, force=args.force)
    print(_summary(assets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
