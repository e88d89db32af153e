"""Register the StatefulSet's inference nodes and hand each its credentials (the Job ``register-nodes``).

Run in the control-plane image, with the control plane's settings and ``QUIVER_NODE_SECRET``:
``python platform/k8s/register-nodes.py``. For every ordinal ``0 … replicas-1`` of the StatefulSet ``node`` it
calls ``inference.gateway.nodes.node_register`` with the pod's stable URLs
(``http://node-<i>.node.<namespace>.svc:8000`` for the engine, ``:8100`` for the agent) and writes the node's key
and heartbeat token into the Secret ``quiver-node-credentials`` as ``node-<i>.key`` / ``node-<i>.token``. The node
pods mount that Secret and read the two files named after themselves. Re-running is safe: registration keeps a
node's credentials (``--rotate`` on ``quiver_node_register`` issues new ones), so scaling up means re-running
the Job. The Kubernetes API is reached with the pod's service-account token (Role ``quiver-registrar``: get the
StatefulSet, get/patch that one Secret).

Environment: ``QUIVER_BASE_MODEL`` (the base model the nodes serve, registered beforehand),
``POD_NAMESPACE``, optional ``QUIVER_NODE_REPLICAS`` (skip reading the StatefulSet), ``KUBERNETES_SERVICE_HOST``
and ``_PORT`` (set by Kubernetes). Exit status 1 with a message when the base model is not registered yet, so the
Job's back-off retries until it is.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SECRET = "quiver-node-credentials"
STATEFULSET = "node"
SERVICE = "node"


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


def node_urls(name: str, namespace: str) -> tuple[str, str]:
    """``(engine_url, agent_url)`` of StatefulSet pod ``name`` through the headless Service ``node``."""
    host = f"{name}.{SERVICE}.{namespace}.svc"
    return f"http://{host}:8000", f"http://{host}:8100"


def register(replicas: int, *, namespace: str, base_model: str) -> dict[str, str]:
    """Register ``node-0 … node-<replicas-1>``; the Secret ``data`` holding their credentials (base64 values).

    Raises:
        inference.gateway.nodes.NodeRefused: e.g. 400 ``base_model_not_found``.
    """
    from inference.gateway.nodes import node_register

    data: dict[str, str] = {}
    for ordinal in range(replicas):
        name = f"{STATEFULSET}-{ordinal}"
        engine_url, agent_url = node_urls(name, namespace)
        _, creds = node_register(name=name, agent_url=agent_url, engine_url=engine_url, base_model_name=base_model)
        data[f"{name}.key"] = base64.b64encode(creds.key.encode()).decode()
        data[f"{name}.token"] = base64.b64encode(creds.token.encode()).decode()
    return data


def main(api: KubeApi | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Register the nodes and patch the Secret; the exit status."""
    import django

    django.setup()
    from inference.gateway.nodes import NodeRefused

    api = api or KubeApi.in_cluster()
    namespace = environ.get("POD_NAMESPACE", "quiver")
    if environ.get("QUIVER_NODE_REPLICAS"):
        replicas = int(environ["QUIVER_NODE_REPLICAS"])
    else:
        replicas = int(api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{STATEFULSET}")
                       ["spec"].get("replicas", 1))
    try:
        data = register(replicas, namespace=namespace, base_model=environ["QUIVER_BASE_MODEL"])
    except NodeRefused as exc:
        print(f"register-nodes: {exc.detail}", file=sys.stderr)
        return 1
    api.call("PATCH", f"/api/v1/namespaces/{namespace}/secrets/{SECRET}", {"data": data},
             content_type="application/merge-patch+json")
    print(f"register-nodes: {replicas} node(s) registered, credentials in Secret {SECRET}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
