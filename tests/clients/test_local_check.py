"""How the client reaches the server's validator: imported (never copied), free of Django, and a one-line fix when
it is not installed beside the client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_client_runs_the_servers_validator_without_django() -> None:
    ran = _python("import sys; from quiver_client import local_check; v = local_check.validator(); "
                  "import adapters_app.validation as server; assert v is server, v; "
                  "assert v.validate_adapter_dir.__module__ == 'adapters_app.validation.validate'; "
                  "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework')], 'django'")
    assert ran.returncode == 0, ran.stderr


def test_without_the_validator_a_push_names_both_fixes(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    # The server package hidden, as in an environment with the client alone.
    ran = _python("import sys; sys.modules['adapters_app'] = None; from quiver_client.cli import main; "
                  f"sys.exit(main(['push', {str(tmp_path)!r}, '--name', 'x', '--url', 'http://127.0.0.1:9', "
                  "'--api-key', 'qv_a.b']))")
    assert ran.returncode == 1
    assert "validator_missing" in ran.stderr and "--no-local-check" in ran.stderr and "pip install" in ran.stderr
    assert "Traceback" not in ran.stderr and "qv_a.b" not in ran.stderr
