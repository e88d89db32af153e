"""The console's typed API client cannot drift from the API: both generated files must match a fresh generation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer

from devtools.frontend import FRONTEND, ensure_node_modules

SCHEMA = FRONTEND / "src" / "api" / "openapi.json"
CLIENT = FRONTEND / "src" / "api" / "schema.d.ts"
FIX = "regenerate with ./scripts/gen-api-client and commit both files"


def test_committed_openapi_document_matches_the_api() -> None:
    fresh = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    assert fresh == json.loads(SCHEMA.read_text()), f"frontend/src/api/openapi.json is stale: {FIX}"


def test_committed_typescript_client_matches_the_openapi_document(tmp_path: Path) -> None:
    ensure_node_modules()
    out = tmp_path / "schema.d.ts"
    subprocess.run([str(FRONTEND / "node_modules" / ".bin" / "openapi-typescript"), str(SCHEMA), "-o", str(out)],
                   cwd=FRONTEND, check=True, capture_output=True)
    assert out.read_text() == CLIENT.read_text(), f"frontend/src/api/schema.d.ts is stale: {FIX}"
