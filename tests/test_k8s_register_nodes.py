"""platform/k8s/register-nodes.py: the Job that registers the node StatefulSets and stores each one's credentials.

The Kubernetes API is a local HTTP server standing in for the API server (a unit-test double: it records the two
calls the Job makes); registration itself runs the real ``node_register`` against the test database.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from inference.fleet.models import Node
from inference.fleet.node_keys import node_credentials

pytestmark = pytest.mark.django_db
SCRIPT = Path(__file__).resolve().parents[1] / "platform" / "k8s" / "register-nodes.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("register_nodes", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


register_nodes = _module()


class _FakeApi(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, str, Any]] = []

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    items: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.calls.append(("GET", self.path, self.headers["Authorization"], None))
        self._answer({"items": self.items})

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("PATCH", self.path, self.headers["Content-Type"], body))
        self._answer({})

    def log_message(self, *args: object) -> None:
        pass


def _node_set(i: int, *, label: bool = True) -> dict[str, Any]:
    """A StatefulSet as platform/k8s/nodes/node-<i> renders it (the fields the Job reads)."""
    return {"metadata": {"name": f"node-{i}", "labels": {"quiver.io/node": f"node-{i}"} if label else {}},
            "spec": {"template": {"spec": {"volumes": [
                {"name": "node-cache", "emptyDir": {}},
                {"name": "credentials", "secret": {"secretName": f"quiver-node-credentials-{i}"}}]}}}}


@pytest.fixture
def fake_api() -> Iterator[Any]:
    _FakeApi.calls = []
    _FakeApi.items = [_node_set(1), _node_set(0)]
    server = HTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield register_nodes.KubeApi(f"http://127.0.0.1:{server.server_port}", "sa-token", None)
    server.shutdown()


def test_registers_every_node_and_patches_only_its_own_secret(base_model: Any, fake_api: Any) -> None:
    status = register_nodes.main(fake_api, {"POD_NAMESPACE": "quiver", "QUIVER_BASE_MODEL": "tiny-llama"})
    assert status == 0
    get, *patches = _FakeApi.calls
    assert get[:3] == ("GET", "/apis/apps/v1/namespaces/quiver/statefulsets?labelSelector="
                       "app.kubernetes.io/component%3Dnode", "Bearer sa-token")
    assert [p[:3] for p in patches] == [
        ("PATCH", f"/api/v1/namespaces/quiver/secrets/quiver-node-credentials-{i}", "application/merge-patch+json")
        for i in (0, 1)]
    keys = []
    for i, patch in enumerate(patches):
        data = {k: base64.b64decode(v).decode() for k, v in patch[3]["data"].items()}
        assert set(data) == {"key", "token"}
        name = f"node-{i}"
        node = Node.objects.get(name=name)
        assert node.engine_url == f"http://{name}-0.node.quiver.svc:8000"
        assert node.agent_url == f"http://{name}-0.node.quiver.svc:8100"
        creds = node_credentials(name, node.key_generation)
        assert (data["key"], data["token"]) == (creds.key, creds.token)
        keys.append(data["key"])
    assert keys[0] != keys[1]


def test_rerunning_keeps_credentials_and_bad_input_fails(base_model: Any, fake_api: Any) -> None:
    env = {"POD_NAMESPACE": "quiver", "QUIVER_BASE_MODEL": "tiny-llama"}
    _FakeApi.items = [_node_set(0)]
    assert register_nodes.main(fake_api, env) == 0
    assert register_nodes.main(fake_api, env) == 0
    first, second = (c[3]["data"] for c in _FakeApi.calls if c[0] == "PATCH")
    assert first == second  # idempotent: a re-run (adding a node) does not rotate anyone
    assert register_nodes.main(fake_api, {**env, "QUIVER_BASE_MODEL": "no-such-model"}) == 1
    _FakeApi.items = [_node_set(0, label=False)]  # not built from platform/k8s/nodes/unit
    assert register_nodes.main(fake_api, env) == 1
