"""Node agent settings, read from the environment (no Django on nodes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_REQUIRED = (
    "QUIVER_NODE_NAME",
    "QUIVER_NODE_KEY",
    "QUIVER_ENGINE_URL",
    "QUIVER_BASE_MODEL",
    "QUIVER_NODE_CACHE_DIR",
)


class ConfigError(ValueError):
    """A required variable is missing or a value does not parse."""


@dataclass(frozen=True)
class NodeSettings:
    """Everything the node agent needs.

    Attributes:
        node_name: `QUIVER_NODE_NAME`, the node's name in the control plane.
        node_key: `QUIVER_NODE_KEY`, this node's key (from `manage.py quiver_node_register`): bearer token for
            every agent route and the vLLM engine's API key.
        node_token: `QUIVER_NODE_TOKEN`, this node's heartbeat token (same command); required with a control URL.
        engine_url: `QUIVER_ENGINE_URL`, vLLM base URL, no trailing slash.
        base_model: `QUIVER_BASE_MODEL`, the engine's served base model name.
        cache_dir: `QUIVER_NODE_CACHE_DIR`, where adapters are staged on disk.
        agent_url: `QUIVER_AGENT_URL`, this agent's URL as the control plane should reach it ("" if unset).
        s3_endpoint_url: `AWS_S3_ENDPOINT_URL`, the only origin the agent downloads from (the presigned GETs each
            load carries; a node holds no S3 credential); None means AWS itself (https `*.amazonaws.com`).
        control_url: `QUIVER_CONTROL_URL`; heartbeats are off when None.
        heartbeat_seconds: `QUIVER_HEARTBEAT_SECONDS`, default 5.
        max_loras: `QUIVER_MAX_LORAS` (vLLM `--max-loras`, default 1 as in `vllm/config/lora.py`).
        max_cpu_loras: `QUIVER_MAX_CPU_LORAS` (default: `max_loras`, as vLLM does).
        max_lora_rank: `QUIVER_MAX_LORA_RANK` (default 16, as vLLM does).
        cache_max_bytes: `QUIVER_NODE_CACHE_MAX_BYTES`, the disk cache's byte budget (LRU beyond it); default
            50 GiB, `0` for unbounded.
        load_redis_url: `QUIVER_LOAD_REDIS_URL` (else `REDIS_URL`), where the engine's load figures are published
            for the gateway's admission gate (`inference.node.load_publisher`); "" = not published.
        load_publish_s: `QUIVER_LOAD_PUBLISH_MS` / 1000, seconds between engine scrapes (default 0.1; at most 0.2 keeps
            the gateway's figures under its 250 ms staleness bound).
        scheduling_policy: `QUIVER_SCHEDULING_POLICY`, the engine's `--scheduling-policy` (`priority`, as
            `inference.node.launch` starts it, or `fcfs`); the gateway sends `priority` only to `priority` engines.
        eviction_policy: `QUIVER_EVICTION_POLICY`, `lru` | `lfu` | `cost` (default `lfu`): which adapter leaves
            the engine's CPU cache when a load needs room (``inference.policy.eviction.choose_victims``), chosen by
            the agent before vLLM's own LRU would.
        effect_probe: `QUIVER_EFFECT_PROBE` (default on, `0` turns it off): after each load, compare a short greedy
            completion with and without the adapter (``EffectProbe.probe``, ``inference.node.effect_probe``).
        eviction_grace_s: `QUIVER_EVICTION_GRACE_MS` / 1000 (default 5 s, `0` turns it off): an adapter loaded here
            less than this long ago is not an eviction victim while an older one can go. LRU and LFU both rank a
            just-loaded adapter coldest (no steps yet), so without it the next load under thrash removes the adapter
            a request is waiting for before that request reaches the engine (bench_fleet, 16 adapters in 8 slots).
    """

    node_name: str
    node_key: str
    node_token: str
    engine_url: str
    base_model: str
    cache_dir: Path
    agent_url: str
    s3_endpoint_url: str | None
    control_url: str | None
    heartbeat_seconds: float
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    cache_max_bytes: int | None = 50 * 1024**3
    load_redis_url: str = ""
    load_publish_s: float = 0.1
    scheduling_policy: str = "priority"
    eviction_policy: str = "lfu"
    effect_probe: bool = True
    eviction_grace_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeSettings:
        """Build settings from an environment mapping.

        Args:
            env: usually `os.environ`.

        Returns:
            The parsed settings.

        Raises:
            ConfigError: a required variable is missing/empty (`QUIVER_NODE_TOKEN` too when `QUIVER_CONTROL_URL`
                is set), a credential is a placeholder (contains "change-me"), or a number does not parse or is < 1.
        """
        required = (*_REQUIRED, "QUIVER_NODE_TOKEN") if env.get("QUIVER_CONTROL_URL") else _REQUIRED
        missing = [name for name in required if not env.get(name)]
        if missing:
            raise ConfigError("missing required environment variables: " + ", ".join(missing))
        for name in ("QUIVER_NODE_KEY", "QUIVER_NODE_TOKEN"):
            if "change-me" in env.get(name, "").lower():
                raise ConfigError(f"{name} is a placeholder; use the value quiver_node_register printed for this node")
        max_loras = _positive_int(env, "QUIVER_MAX_LORAS", 1)
        return cls(
            node_name=env["QUIVER_NODE_NAME"],
            node_key=env["QUIVER_NODE_KEY"],
            node_token=env.get("QUIVER_NODE_TOKEN", ""),
            engine_url=env["QUIVER_ENGINE_URL"].rstrip("/"),
            base_model=env["QUIVER_BASE_MODEL"],
            cache_dir=Path(env["QUIVER_NODE_CACHE_DIR"]),
            agent_url=env.get("QUIVER_AGENT_URL", "").rstrip("/"),
            s3_endpoint_url=env.get("AWS_S3_ENDPOINT_URL") or None,
            control_url=(env.get("QUIVER_CONTROL_URL") or "").rstrip("/") or None,
            heartbeat_seconds=_positive_float(env, "QUIVER_HEARTBEAT_SECONDS", 5.0),
            max_loras=max_loras,
            max_cpu_loras=_positive_int(env, "QUIVER_MAX_CPU_LORAS", max_loras),
            max_lora_rank=_positive_int(env, "QUIVER_MAX_LORA_RANK", 16),
            cache_max_bytes=_cache_budget(env),
            load_redis_url=env.get("QUIVER_LOAD_REDIS_URL") or env.get("REDIS_URL") or "",
            load_publish_s=_positive_float(env, "QUIVER_LOAD_PUBLISH_MS", 100.0) / 1000,
            scheduling_policy=_policy(env),
            eviction_policy=eviction_policy_from_env(env),
            effect_probe=env.get("QUIVER_EFFECT_PROBE", "1").strip().lower() not in ("0", "false", "no", "off"),
            eviction_grace_s=eviction_grace_from_env(env),
        )


def _policy(env: Mapping[str, str]) -> str:
    value = env.get("QUIVER_SCHEDULING_POLICY", "priority")
    if value not in ("priority", "fcfs"):
        raise ConfigError(f"QUIVER_SCHEDULING_POLICY must be 'priority' or 'fcfs', got {value!r}")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from exc
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool = False) -> float:
    """``env[name]`` as a finite float > 0 (>= 0 with ``zero_ok``), ``default`` when unset or empty."""
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from exc
    if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        raise ConfigError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, got {raw}")
    return value


def _cache_budget(env: Mapping[str, str]) -> int | None:
    raw = env.get("QUIVER_NODE_CACHE_MAX_BYTES")
    if not raw:
        return 50 * 1024**3
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"QUIVER_NODE_CACHE_MAX_BYTES must be an integer (bytes), got {raw!r}") from exc
    if value < 0:
        raise ConfigError(f"QUIVER_NODE_CACHE_MAX_BYTES must be >= 0 (0 = unbounded), got {value}")
    return value or None


EVICTION_POLICIES = ("lru", "lfu", "cost")


def eviction_policy_from_env(env: Mapping[str, str]) -> str:
    """``QUIVER_EVICTION_POLICY`` (default ``lfu``), read by the agent and by the engine's worker extension.

    Raises:
        ConfigError: not one of ``EVICTION_POLICIES``.
    """
    value = (env.get("QUIVER_EVICTION_POLICY") or "lfu").strip().lower()
    if value not in EVICTION_POLICIES:
        raise ConfigError(f"QUIVER_EVICTION_POLICY={value!r}; use one of {', '.join(EVICTION_POLICIES)}")
    return value


def eviction_grace_from_env(env: Mapping[str, str]) -> float:
    """``QUIVER_EVICTION_GRACE_MS`` / 1000 in seconds (default 5 s, ``0`` turns it off), read by the agent and by the
    engine's worker extension (``NodeSettings.eviction_grace_s``).

    Raises:
        ValueError: not a number ≥ 0.
    """
    return _positive_float(env, "QUIVER_EVICTION_GRACE_MS", 5000.0, zero_ok=True) / 1000
