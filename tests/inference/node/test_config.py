"""Node agent settings from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.node.config import ConfigError, NodeSettings

REQUIRED = {
    "QUIVER_NODE_NAME": "node-1",
    "QUIVER_NODE_KEY": "k",
    "QUIVER_ENGINE_URL": "http://127.0.0.1:8011/",
    "QUIVER_BASE_MODEL": "tiny-llama",
    "QUIVER_NODE_CACHE_DIR": "/var/cache/quiver",
}


def test_defaults_follow_vllm() -> None:
    settings = NodeSettings.from_env(REQUIRED)

    assert settings.engine_url == "http://127.0.0.1:8011"
    assert settings.cache_dir == Path("/var/cache/quiver")
    assert settings.control_url is None
    assert settings.heartbeat_seconds == 5.0
    assert (settings.max_loras, settings.max_cpu_loras, settings.max_lora_rank) == (1, 1, 16)
    assert settings.s3_endpoint_url is None


def test_explicit_values() -> None:
    env = {
        **REQUIRED,
        "QUIVER_CONTROL_URL": "http://control/",
        "QUIVER_NODE_TOKEN": "qvn_node-1.t",
        "QUIVER_HEARTBEAT_SECONDS": "0.5",
        "QUIVER_MAX_LORAS": "2",
        "QUIVER_MAX_LORA_RANK": "64",
        "AWS_S3_ENDPOINT_URL": "http://s3:8333",
    }

    settings = NodeSettings.from_env(env)

    assert settings.control_url == "http://control"
    assert settings.heartbeat_seconds == 0.5
    assert (settings.max_loras, settings.max_cpu_loras, settings.max_lora_rank) == (2, 2, 64)
    assert settings.s3_endpoint_url == "http://s3:8333"


def test_missing_required_names_them_all() -> None:
    env = {k: v for k, v in REQUIRED.items() if k not in ("QUIVER_NODE_KEY", "QUIVER_BASE_MODEL")}

    with pytest.raises(ConfigError, match="QUIVER_NODE_KEY, QUIVER_BASE_MODEL"):
        NodeSettings.from_env(env)


@pytest.mark.parametrize(
    ("name", "value"),
    [("QUIVER_MAX_LORAS", "two"), ("QUIVER_MAX_LORAS", "0"), ("QUIVER_HEARTBEAT_SECONDS", "-1")],
)
def test_bad_numbers_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        NodeSettings.from_env({**REQUIRED, name: value})


def test_heartbeats_need_the_node_token() -> None:
    with pytest.raises(ConfigError, match="QUIVER_NODE_TOKEN"):
        NodeSettings.from_env({**REQUIRED, "QUIVER_CONTROL_URL": "http://control"})


@pytest.mark.parametrize("name", ["QUIVER_NODE_KEY", "QUIVER_NODE_TOKEN"])
def test_placeholder_credentials_are_refused(name: str) -> None:
    env = {**REQUIRED, "QUIVER_CONTROL_URL": "http://control", "QUIVER_NODE_TOKEN": "qvn_node-1.t",
           name: "CHANGE-ME-node-key"}
    with pytest.raises(ConfigError, match=f"{name} is a placeholder"):
        NodeSettings.from_env(env)


@pytest.mark.parametrize(("raw", "seconds"), [(None, 5.0), ("0", 0.0), ("250", 0.25)])
def test_eviction_grace_in_milliseconds(raw: str | None, seconds: float) -> None:
    env = {**REQUIRED, **({"QUIVER_EVICTION_GRACE_MS": raw} if raw is not None else {})}
    assert NodeSettings.from_env(env).eviction_grace_s == seconds


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_eviction_grace_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="QUIVER_EVICTION_GRACE_MS"):
        NodeSettings.from_env({**REQUIRED, "QUIVER_EVICTION_GRACE_MS": raw})
