"""Register the inference nodes and hand each its own credentials (the Job ``register-nodes``).

Run in the control-plane image, with the control plane's settings and ``QUIVER_NODE_SECRET``:
``python platform/k8s/register-nodes.py``. Every node is a one-pod StatefulSet of its own (platform/k8s/nodes),
labelled ``app.kubernetes.io/component=node`` and ``quiver.io/node=<node name>``. For each one the Job calls
``inference.fleet.nodes.node_register`` with its pod's stable URLs (``http://<statefulset>-0.node.<namespace>.svc``
port 8000 for the engine, 8100 for the agent) and writes the node's key and heartbeat token into the Secret its pod
mounts as ``credentials`` (keys ``key`` and ``token``), so no pod can read another node's. Re-running is safe:
registration keeps a node's credentials (``--rotate`` on ``quiver_node_register`` issues new ones), so adding a
node means re-running the Job. The Kubernetes API is reached with the pod's service-account token (Role
``quiver-registrar``: list StatefulSets; each node's Role: get/patch its one Secret).

Environment: ``QUIVER_BASE_MODEL`` (the base model the nodes serve, registered beforehand), ``POD_NAMESPACE``,
``KUBERNETES_SERVICE_HOST`` and ``_PORT`` (set by Kubernetes). Exit status 1 with a message when the base model is
not registered yet or a node StatefulSet lacks its label or Secret, so the Job's back-off retries.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE = "node"
NODE_SELECTOR = "app.kubernetes.io/component=node"
NODE_LABEL = "quiver.io/node"


class KubeApi:
    """The few Kubernetes API calls the Job makes, authenticated with a bearer token (JSON in and out)."""

    def __init__(self, base_url: str, token: str, context: ssl.SSLContext | None) -> None:
        """``base_url`` like ``https://10.0.0.1:443``; ``context`` verifies the API server (None for plain http)."""
        self.base_url, self.token, self.context = base_url.rstrip("/"), token, context

    @classmethod
    def in_cluster(cls) -> KubeApi:
        """From the pod's service-account token and CA."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        context = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
        return cls(f"https://{host}:{port}", (SA_DIR / "token").read_text().strip(), context)

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
             content_type: str = "application/json") -> dict[str, Any]:
        """``method path`` with a JSON body; the decoded JSON answer. Raises ``urllib.error.HTTPError``."""
        request = urllib.request.Request(self.base_url + path, method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(request, context=self.context, timeout=30) as response:  # noqa: S310
            return json.loads(response.read() or b"{}")


class NodeSet(NamedTuple):
    """One node's StatefulSet: the node's name, its pod's name and the Secret the pod mounts."""

    node: str
    pod: str
    secret: str


def node_urls(pod: str, namespace: str) -> tuple[str, str]:
    """``(engine_url, agent_url)`` of StatefulSet pod ``pod`` through the headless Service ``node``."""
    host = f"{pod}.{SERVICE}.{namespace}.svc"
    return f"http://{host}:8000", f"http://{host}:8100"


def node_sets(items: list[dict[str, Any]]) -> list[NodeSet]:
    """The nodes in a StatefulSet list (``items`` of ``GET .../statefulsets?labelSelector=...``).

    Raises:
        ValueError: a node StatefulSet without the ``quiver.io/node`` label or a ``credentials`` Secret volume.
    """
    out = []
    for item in items:
        name = item["metadata"]["name"]
        node = item["metadata"].get("labels", {}).get(NODE_LABEL)
        volumes = {v["name"]: v for v in item["spec"]["template"]["spec"].get("volumes", [])}
        secret = volumes.get("credentials", {}).get("secret", {}).get("secretName")
        if not node or not secret:
            raise ValueError(f"StatefulSet {name}: needs the label {NODE_LABEL} and a Secret volume 'credentials' "
                             "(build nodes from platform/k8s/nodes/unit)")
        out.append(NodeSet(node=node, pod=f"{name}-0", secret=secret))
    return sorted(out, key=lambda n: n.node)


def register(nodes: list[NodeSet], *, namespace: str, base_model: str) -> dict[str, dict[str, str]]:
    """Register ``nodes``; ``{secret name: Secret data}`` holding each one's credentials (base64 ``key``, ``token``).

    Raises:
        inference.fleet.nodes.NodeRefused: e.g. 400 ``base_model_not_found``.
    """
    from inference.fleet.nodes import node_register

    out: dict[str, dict[str, str]] = {}
    for n in nodes:
        engine_url, agent_url = node_urls(n.pod, namespace)
        _, creds = node_register(name=n.node, agent_url=agent_url, engine_url=engine_url, base_model_name=base_model)
        out[n.secret] = {"key": base64.b64encode(creds.key.encode()).decode(),
                         "token": base64.b64encode(creds.token.encode()).decode()}
    return out


def main(api: KubeApi | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Register the nodes and patch each one's Secret; the exit status."""
    import django

    django.setup()
    from inference.fleet.nodes import NodeRefused

    api = api or KubeApi.in_cluster()
    namespace = environ.get("POD_NAMESPACE", "quiver")
    listing = api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets?labelSelector="
                       + urllib.parse.quote(NODE_SELECTOR))
    try:
        nodes = node_sets(listing.get("items", []))
        secrets = register(nodes, namespace=namespace, base_model=environ["QUIVER_BASE_MODEL"])
    except ValueError as exc:
        print(f"register-nodes: {exc}", file=sys.stderr)
        return 1
    except NodeRefused as exc:
        print(f"register-nodes: {exc.detail}", file=sys.stderr)
        return 1
    for secret, data in secrets.items():
        api.call("PATCH", f"/api/v1/namespaces/{namespace}/secrets/{secret}", {"data": data},
                 content_type="application/merge-patch+json")
    print(f"register-nodes: {len(nodes)} node(s) registered: " + ", ".join(n.node for n in nodes))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
