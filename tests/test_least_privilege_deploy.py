"""What compose and Kubernetes give each process (issue 30, points 4, 5 and 7), read from the rendered files.

- nodes hold the read-only S3 credential (platform/s3/node-read-policy.json), never the control plane's or the
  root user's;
- web takes ``X-Forwarded-For`` only from its proxy (compose: the ``edge`` network only the proxy joins; Kubernetes:
  the NetworkPolicies admit only the ingress controller), and Caddy trusts nobody's;
- every uvicorn serving Django runs the read deadlines of ``config.request_timeouts``.

The live halves are tests/devtools/test_node_s3_credential.py (the credential against a real SeaweedFS),
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
POLICY = json.loads((REPO / "platform" / "s3" / "node-read-policy.json").read_text())
TIMEOUTS = ["--http", "config.request_timeouts:TimedHTTPProtocol"]


def _has(command: list[str], flags: list[str]) -> bool:
    return any(command[i:i + len(flags)] == flags for i in range(len(command)))


def test_the_node_policy_grants_get_object_under_tenants_and_nothing_else() -> None:
    (statement,) = POLICY["Statement"]
    assert statement["Effect"] == "Allow" and statement["Action"] == ["s3:GetObject"]
    assert statement["Resource"] == ["arn:aws:s3:::BUCKET/tenants/*"]


def test_compose_nodes_use_the_read_only_user(tmp_path: Path) -> None:
    services = _rendered(tmp_path)["services"]
    agent = services["node-agent"]["environment"]
    minio = services["minio"]["environment"]
    assert agent["AWS_ACCESS_KEY_ID"] != minio["MINIO_ROOT_USER"]
    assert agent["AWS_SECRET_ACCESS_KEY"] != minio["MINIO_ROOT_PASSWORD"]
    assert not any(k.startswith(("AWS_", "MINIO_")) for k in services["vllm"]["environment"])
    make = services["createbuckets"]
    assert make["environment"]["NODE_ACCESS_KEY"] == agent["AWS_ACCESS_KEY_ID"]
    assert make["environment"]["NODE_SECRET_KEY"] == agent["AWS_SECRET_ACCESS_KEY"]
    assert any(v["source"].endswith("platform/s3/node-read-policy.json") for v in make["volumes"])
    script = " ".join(make["command"])
    for step in ("mc admin policy create local quiver-node-read", 'mc admin user add local "$$NODE_ACCESS_KEY"',
                 "mc admin policy attach local quiver-node-read --user"):
        assert step in script, step
    assert services["node-agent"]["depends_on"]["createbuckets"]["condition"] == "service_completed_successfully"


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
def test_k8s_nodes_take_s3_from_the_node_secret_only(overlay: str) -> None:
    docs = render(overlay)
    for where, template in pod_templates(docs):
        if template["metadata"]["labels"].get("app.kubernetes.io/component") != "node":
            continue
        for c in template["spec"]["containers"]:
            refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})}
            assert all(refs.get(k, "quiver-node-secrets") == "quiver-node-secrets"
                       for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")), (where, c["name"])
            assert not any("secretRef" in s for s in c.get("envFrom", [])), (where, c["name"])


def test_in_cluster_minio_makes_the_node_user_with_the_policy_file() -> None:
    job = objects(render("cpu-dev"), "Job")["createbuckets"]["spec"]["template"]
    mc = container(job, "mc")
    script = " ".join(mc["args"])
    inline = json.loads(re.search(r"printf '%s' '(\{.*?\})'", script).group(1))  # type: ignore[union-attr]
    assert inline == json.loads(json.dumps(POLICY).replace("BUCKET", "quiver"))
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in mc["env"]}
    assert env["NODE_ACCESS_KEY"] == {"name": "quiver-node-secrets", "key": "AWS_ACCESS_KEY_ID"}
    assert env["NODE_SECRET_KEY"] == {"name": "quiver-node-secrets", "key": "AWS_SECRET_ACCESS_KEY"}
    assert "mc admin policy attach local quiver-node-read" in script


def test_dev_secrets_give_nodes_their_own_s3_user() -> None:
    import subprocess

    import yaml

    out = subprocess.run([str(K8S / "dev-secrets")], capture_output=True, text=True, timeout=30, check=True).stdout
    data = {d["metadata"]["name"]: d["stringData"] for d in yaml.safe_load_all(out) if d and d["kind"] == "Secret"}
    node, control = data["quiver-node-secrets"], data["quiver-secrets"]
    assert node["AWS_ACCESS_KEY_ID"] != control["MINIO_ROOT_USER"]
    assert node["AWS_SECRET_ACCESS_KEY"] not in (control["MINIO_ROOT_PASSWORD"], control["AWS_SECRET_ACCESS_KEY"])
