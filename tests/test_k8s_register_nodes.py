"""platform/k8s/register-nodes.py: the Job that registers the StatefulSet's nodes and stores their credentials.

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

from inference.gateway.models import Node
from inference.gateway.node_keys import node_credentials

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

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.calls.append(("GET", self.path, self.headers["Authorization"], None))
        self._answer({"spec": {"replicas": 2}})

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(("PATCH", self.path, self.headers["Content-Type"], body))
        self._answer({})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[Any]:
    _FakeApi.calls = []
    server = HTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield register_nodes.KubeApi(f"http://127.0.0.1:{server.server_port}", "sa-token", None)
    server.shutdown()


def test_registers_every_ordinal_and_patches_the_secret(base_model: Any, fake_api: Any) -> None:
    status = register_nodes.main(fake_api, {"POD_NAMESPACE": "quiver", "QUIVER_BASE_MODEL": "tiny-llama"})
    assert status == 0
    (get, patch) = _FakeApi.calls
    assert get[:3] == ("GET", "/apis/apps/v1/namespaces/quiver/statefulsets/node", "Bearer sa-token")
    assert patch[:3] == ("PATCH", "/api/v1/namespaces/quiver/secrets/quiver-node-credentials",
                         "application/merge-patch+json")
    data = {k: base64.b64decode(v).decode() for k, v in patch[3]["data"].items()}
    assert set(data) == {"node-0.key", "node-0.token", "node-1.key", "node-1.token"}
    for name in ("node-0", "node-1"):
        node = Node.objects.get(name=name)
        assert node.engine_url == f"http://{name}.node.quiver.svc:8000"
        assert node.agent_url == f"http://{name}.node.quiver.svc:8100"
        creds = node_credentials(name, node.key_generation)
        assert (data[f"{name}.key"], data[f"{name}.token"]) == (creds.key, creds.token)
    assert data["node-0.key"] != data["node-1.key"]


def test_rerunning_keeps_credentials_and_an_unknown_base_model_fails(base_model: Any, fake_api: Any) -> None:
    env = {"POD_NAMESPACE": "quiver", "QUIVER_BASE_MODEL": "tiny-llama", "QUIVER_NODE_REPLICAS": "1"}
    assert register_nodes.main(fake_api, env) == 0
    assert register_nodes.main(fake_api, env) == 0
    first, second = (c[3]["data"] for c in _FakeApi.calls)
    assert first == second  # idempotent: a re-run (scale-up) does not rotate anyone
    assert register_nodes.main(fake_api, {**env, "QUIVER_BASE_MODEL": "no-such-model"}) == 1
