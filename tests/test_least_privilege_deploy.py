"""What compose and Kubernetes give each process (issue 30, points 4, 5 and 7), read from the rendered files.

- nodes hold no S3 credential at all (each load carries presigned GETs: docs/security.md), never the control plane's
  or the root user's, and no MinIO user is made for them;
- web takes ``X-Forwarded-For`` only from its proxy (compose: the ``edge`` network only the proxy joins; Kubernetes:
  the NetworkPolicies admit only the ingress controller), and Caddy trusts nobody's;
- every uvicorn serving Django runs the read deadlines of ``config.request_timeouts``.

The live halves are tests/inference/node/test_presigned_reads.py (the presigned GETs against a real S3 server),
tests/tenants/test_login_behind_proxies.py and tests/config/test_request_timeouts.py (real uvicorn processes).
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_compose import _rendered
from tests.test_k8s import K8S, container, may_connect, objects, pod_templates, render

REPO = Path(__file__).resolve().parents[1]
S3_CREDENTIAL = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "MINIO_ROOT_USER",
                 "MINIO_ROOT_PASSWORD")
TIMEOUTS = ["--http", "config.request_timeouts:TimedHTTPProtocol"]


def _has(command: list[str], flags: list[str]) -> bool:
    return any(command[i:i + len(flags)] == flags for i in range(len(command)))


def test_compose_nodes_hold_no_s3_credential(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    for name in ("node-agent", "vllm"):
        env = services[name].get("environment") or {}
        assert not set(env) & set(S3_CREDENTIAL), name
    assert services["node-agent"]["environment"]["AWS_S3_ENDPOINT_URL"] == "http://minio:9000"
    script = " ".join(services["createbuckets"]["command"])
    assert "mc admin user add" not in script and "NODE_" not in script


def test_compose_web_trusts_forwarded_for_from_the_proxy_alone(tmp_path: Path) -> None:
    rendered = _rendered(tmp_path)
    services = rendered["services"]
    on_edge = sorted(name for name, svc in services.items() if "edge" in (svc.get("networks") or {}))
    assert on_edge == ["proxy", "web"]
    assert list(services["proxy"]["networks"]) == ["edge"]
    subnet = ipaddress.ip_network(rendered["networks"]["edge"]["ipam"]["config"][0]["subnet"])
    web = services["web"]
    assert "--proxy-headers" in web["command"] and not any("forwarded-allow-ips" in a for a in web["command"])
    assert ipaddress.ip_network(web["environment"]["FORWARDED_ALLOW_IPS"]) == subnet
    assert "--no-proxy-headers" in services["web-internal"]["command"]
    caddyfile = (REPO / "platform" / "caddy" / "Caddyfile").read_text()
    assert "trusted_proxies" not in re.sub(r"#.*", "", caddyfile)  # Caddy is the edge: it trusts no client's header
    assert "read_header" in caddyfile


def test_compose_django_servers_cut_slow_clients(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    for name in ("web", "web-internal"):
        assert _has(services[name]["command"], TIMEOUTS), name


def _uvicorn_commands(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    found = {}
    for where, template in pod_templates(docs):
        for c in template["spec"]["containers"]:
            command = c.get("command") or []
            if command[:1] == ["uvicorn"] and command[1].startswith("config."):
                found[f"{where}/{c['name']}"] = command
    return found


@pytest.mark.parametrize("overlay", ["gpu", "cpu-dev"])
def test_k8s_django_servers_cut_slow_clients_and_trust_only_the_ingress(overlay: str) -> None:
    docs = render(overlay)
    commands = _uvicorn_commands(docs)
    assert len(commands) >= 4, commands  # web, web-internal, gateway and its metrics listener
    for where, command in commands.items():
        assert _has(command, TIMEOUTS), where
        assert not any("forwarded-allow-ips" in a for a in command), where  # from FORWARDED_ALLOW_IPS only
        public = "config.asgi:application" in command
        assert ("--proxy-headers" in command) == public and ("--no-proxy-headers" in command) == (not public), where
    config = next(c["data"] for c in objects(docs, "ConfigMap").values() if "FORWARDED_ALLOW_IPS" in c.get("data", {}))
    if config["FORWARDED_ALLOW_IPS"] == "*":
        # Then the network decides who the direct peer can be: the ingress controller (and monitoring) only.
        for name in ("web", "gateway"):
            labels = objects(docs, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
            assert may_connect(docs, source_ns="ingress-nginx", source_labels={}, target_labels=labels, port=8000)
            for ns, pod in (("quiver", {"app.kubernetes.io/component": "node"}), ("quiver", {}), ("default", {})):
                assert not may_connect(docs, source_ns=ns, source_labels=pod, target_labels=labels, port=8000), \
                    (name, ns, pod)


@pytest.mark.parametrize("overlay", ["gpu", "cpu-dev"])
def test_k8s_nodes_hold_no_s3_credential(overlay: str) -> None:
    docs = render(overlay)
    seen = 0
    for where, template in pod_templates(docs):
        if template["metadata"]["labels"].get("app.kubernetes.io/component") != "node":
            continue
        for c in template["spec"]["containers"]:
            seen += 1
            assert not {e["name"] for e in c.get("env", [])} & set(S3_CREDENTIAL), (where, c["name"])
            assert not any("secretRef" in s for s in c.get("envFrom", [])), (where, c["name"])
    assert seen >= 2  # the engine and the agent


def test_in_cluster_minio_makes_no_node_user() -> None:
    job = objects(render("cpu-dev"), "Job")["createbuckets"]["spec"]["template"]
    mc = container(job, "mc")
    assert "mc admin user add" not in " ".join(mc["args"])
    assert not any("quiver-node-secrets" in json.dumps(e) for e in mc["env"])


def test_dev_secrets_give_nodes_no_s3_key() -> None:
    import subprocess

    import yaml

    out = subprocess.run([str(K8S / "dev-secrets")], capture_output=True, text=True, timeout=30, check=True).stdout
    data = {d["metadata"]["name"]: d["stringData"] for d in yaml.safe_load_all(out) if d and d["kind"] == "Secret"}
    assert not set(data["quiver-node-secrets"]) & set(S3_CREDENTIAL)
