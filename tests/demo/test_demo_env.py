"""The demo writes its control-plane environment for operators' manage.py (README "Using it")."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from demo import run
from demo.run import DEMO_ENV_KEYS, _fresh_workdir, _write_env


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


def test_the_run_folder_is_owner_only_and_made_anew(tmp_path: Path) -> None:
    """The demo's database (session keys are the cookies), S3 folder (every tenant's adapters) and logs lie in its run
    folder, which was 0755 with 0644 files: any local user read the operator's session (attack round)."""
    workdir = tmp_path / "a" / "demo-run"
    workdir.mkdir(parents=True)
    (workdir / "old.sqlite3").write_text("x")
    old_umask = os.umask(0o022)
    try:
        _fresh_workdir(workdir)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(workdir).st_mode) == 0o700
    assert sorted(p.name for p in workdir.iterdir()) == ["logs"]
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ls", str(workdir)],
                           capture_output=True, text=True, check=False) if os.geteuid() == 0 else None
    if probe is not None:  # as nobody, the folder cannot even be listed
        assert probe.returncode != 0 and "Permission denied" in probe.stderr


def test_a_child_that_exits_is_restarted_and_named(tmp_path: Path) -> None:
    """A kept-up demo whose Celery worker died queued uploads nothing checked (fresh-user round): children that exit
    are restarted, with a line naming the child, its exit code and its log, and the log keeps the crash."""
    import sys
    import time

    from demo.run import Processes

    procs = Processes(tmp_path)
    flag = tmp_path / "ran-once"
    script = ("import pathlib, sys, time; f = pathlib.Path(sys.argv[1]); "
              "first = not f.exists(); f.touch(); print('crash' if first else 'up', flush=True); "
              "sys.exit(3) if first else time.sleep(60)")
    procs.start("worker", [sys.executable, "-c", script, str(flag)], {})
    try:
        dict(procs.procs)["worker"].wait(timeout=60)
        lines = procs.revive()
        assert lines == [f"worker exited with code 3; restarted it (its log: {tmp_path / 'worker.log'})"]
        deadline = time.monotonic() + 60
        while "up" not in (tmp_path / "worker.log").read_text():  # the restarted one is running
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.05)
        assert procs.revive() == [] and dict(procs.procs)["worker"].poll() is None
    finally:
        procs.stop_all()
    assert (tmp_path / "worker.log").read_text().startswith("crash\n")  # the crash's output is kept


def test_the_node_wait_reads_the_node_row_and_never_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait asked the gateway with the demo tenant's key, and each 503 while the node warmed up was metered as one
    of that tenant's errors; it now runs ``manage.py quiver_node_wait`` (the node's row) and says why it gave up."""
    calls: list[tuple[str, ...]] = []

    def manage(env: dict[str, str], *args: str) -> str:
        calls.append(args)
        if args[1] == "slow-node":
            raise subprocess.CalledProcessError(1, "manage.py", stderr="CommandError: Node 'slow-node' was not live")
        return "node n1 is live"

    monkeypatch.setattr(run, "_manage", manage)
    run._wait_node_live({"DATABASE_URL": "sqlite:///x"}, "n1", timeout=5)
    assert calls == [("quiver_node_wait", "n1", "--timeout", "5")]
    with pytest.raises(SystemExit, match="no node reported itself live: CommandError: Node 'slow-node'"):
        run._wait_node_live({}, "slow-node", timeout=1)
