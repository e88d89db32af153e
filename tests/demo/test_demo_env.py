"""The demo writes its control-plane environment for operators' manage.py (README "Using it")."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from demo.run import DEMO_ENV_KEYS, _write_env


def test_the_env_file_is_owner_only_and_sources_back_exactly(tmp_path: Path) -> None:
    env = {"DATABASE_URL": "sqlite:////tmp/a b'c.sqlite3", "DJANGO_SECRET_KEY": "s$e`c\"r'et", "PATH": "/bin",
           "HOME": "/root"}
    path = tmp_path / "env"
    _write_env(path, env)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "PATH" not in path.read_text() and "HOME" not in path.read_text()  # only the demo's own settings
    out = subprocess.run(["bash", "-c", f"set -a; . {path}; set +a; printf '%s\\n%s' \"$DATABASE_URL\" "
                          "\"$DJANGO_SECRET_KEY\""], capture_output=True, text=True, check=True).stdout
    assert out.split("\n") == [env["DATABASE_URL"], env["DJANGO_SECRET_KEY"]]
    assert {"DATABASE_URL", "DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY"} <= set(DEMO_ENV_KEYS)
