"""Tests for devtools.services: real SeaweedFS / Redis / PostgreSQL processes, no Django involved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from devtools.proc import pid_alive
from devtools.redis_server import _ping, start_redis
from devtools.seaweedfs import S3Service, s3_client, start_seaweedfs

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Service]:
    """One SeaweedFS for the module: start-up is ~1 s but a graceful stop is ~4 s."""
    with start_seaweedfs(tmp_path_factory.mktemp("weed"), bucket="quiver-test") as service:
        yield service


def test_seaweedfs_put_get_with_the_right_credentials(s3: S3Service) -> None:
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="adapters/a.bin", Body=b"\x00weights\xff")
    body = client.get_object(Bucket=s3.bucket, Key="adapters/a.bin")["Body"].read()
    assert body == b"\x00weights\xff"
    assert s3.env() == {
        "AWS_S3_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_STORAGE_BUCKET_NAME": "quiver-test",
    }


def test_seaweedfs_refuses_a_wrong_secret(s3: S3Service) -> None:
    # Auth is only on because of the identities file; without it this put would succeed.
    bad = s3_client(s3.endpoint_url, s3.access_key, s3.secret_key + "x")
    with pytest.raises(ClientError) as excinfo:
        bad.put_object(Bucket=s3.bucket, Key="intruder", Body=b"x")
    assert excinfo.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_seaweedfs_refuses_an_unknown_key(s3: S3Service) -> None:
    bad = s3_client(s3.endpoint_url, "nobody", s3.secret_key)
    with pytest.raises(ClientError) as excinfo:
        bad.list_objects_v2(Bucket=s3.bucket)
    assert excinfo.value.response["Error"]["Code"] == "InvalidAccessKeyId"


def test_redis_answers_ping_and_stops(tmp_path: Path) -> None:
    with start_redis(tmp_path) as redis:
        assert redis.url == f"redis://127.0.0.1:{redis.port}/0"
        assert _ping(redis.port)
        pid = redis.process.pid
    assert not pid_alive(pid)


def test_cli_starts_all_services_exports_env_and_tears_down(tmp_path: Path) -> None:
    """The full CLI path: PostgreSQL (role quiver may create a DB), Redis, SeaweedFS, exit code passthrough."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, subprocess, sys\n"
        "keys = ['DATABASE_URL', 'REDIS_URL', 'CELERY_BROKER_URL', 'AWS_S3_ENDPOINT_URL', 'AWS_ACCESS_KEY_ID',\n"
        "        'AWS_SECRET_ACCESS_KEY', 'AWS_STORAGE_BUCKET_NAME']\n"
        "env = {k: os.environ.get(k) for k in keys}\n"
        # pytest-django needs CREATEDB; prove it with the exported URL.
        "sql = subprocess.run(['psql', env['DATABASE_URL'], '-Atc', 'CREATE DATABASE test_probe'],\n"
        "                     capture_output=True, text=True)\n"
        "env['createdb_rc'] = sql.returncode\n"
        "env['pids'] = subprocess.run(['ps', '-o', 'pid=', '--ppid', str(os.getppid())],\n"
        "                             capture_output=True, text=True).stdout.split()\n"
        "print(json.dumps(env))\n"
        "sys.exit(7)\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL") and not k.startswith("AWS_")}
    done = subprocess.run([sys.executable, "-m", "devtools.services", "run", "--", sys.executable, str(probe)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 7, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["DATABASE_URL"].startswith("postgres://quiver:quiver@127.0.0.1:")
    assert seen["REDIS_URL"].startswith("redis://127.0.0.1:")
    assert seen["CELERY_BROKER_URL"] == seen["REDIS_URL"]
    assert seen["AWS_S3_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert seen["AWS_STORAGE_BUCKET_NAME"] == "quiver"
    assert seen["createdb_rc"] == 0
    assert "devtools.services: started postgres" in done.stderr
    # Every service the wrapper started (its children) is gone after it returns.
    service_pids = [int(p) for p in seen["pids"]]
    assert len(service_pids) >= 3
    assert not any(pid_alive(p) for p in service_pids)


def test_cli_skips_services_given_by_env() -> None:
    env = {**os.environ, "DATABASE_URL": "sqlite:///x", "REDIS_URL": "redis://given:1/0",
           "AWS_S3_ENDPOINT_URL": "http://given:9"}
    done = subprocess.run([sys.executable, "-m", "devtools.services", "run", "--", sys.executable, "-c",
                           "import os; print(os.environ['REDIS_URL'], os.environ.get('CELERY_BROKER_URL'))"],
                          cwd=REPO_ROOT, env={k: v for k, v in env.items() if k != "CELERY_BROKER_URL"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["redis://given:1/0", "None"]
    assert "started nothing" in done.stderr


def test_cli_fails_cleanly_when_a_service_cannot_start(tmp_path: Path) -> None:
    """A service that cannot start gives rc 1 and a readable reason, runs nothing and leaves no temp folder."""
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(QUIVER_PG_BIN=str(tmp_path / "no-such-bin"), TMPDIR=str(tmp_path), REDIS_URL="redis://given:1/0",
               AWS_S3_ENDPOINT_URL="http://given:9")
    done = subprocess.run([sys.executable, "-m", "devtools.services", "run", "--", "touch", str(marker)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "PostgreSQL binaries not in" in done.stderr
    assert not marker.exists()
    assert not list(tmp_path.glob("quiver-services-*"))


@pytest.mark.parametrize(("sig", "expected_rc"), [(signal.SIGTERM, 128 + signal.SIGTERM),
                                                  (signal.SIGINT, 128 + signal.SIGINT)])
def test_cli_forwards_signals_to_the_command(tmp_path: Path, sig: signal.Signals, expected_rc: int) -> None:
    """SIGTERM (and SIGINT without a terminal) reach the command; its death by signal becomes 128 + n."""
    ready = tmp_path / "started"
    env = {**os.environ, "DATABASE_URL": "sqlite:///x", "REDIS_URL": "redis://given:1/0",
           "AWS_S3_ENDPOINT_URL": "http://given:9"}
    # exec: the shell becomes sleep, so the forwarded signal hits a process with default handlers.
    wrapper = subprocess.Popen([sys.executable, "-m", "devtools.services", "run", "--", "sh", "-c",
                                f"touch {ready}; exec sleep 60"],
                               cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and wrapper.poll() is None, "command never started"
            time.sleep(0.05)
        wrapper.send_signal(sig)
        assert wrapper.wait(timeout=20) == expected_rc
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_a_service_dies_with_the_process_that_started_it_even_on_sigkill(tmp_path: Path) -> None:
    """Redis runs in a session of its own; SIGKILL its parent (as an impatient user or CI's timeout would) and it
    must still go, not keep its port and data folder."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from devtools.redis_server import start_redis\n"
        "service = start_redis(Path(sys.argv[1]))\n"
        "print(service.process.pid, service.port, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "redis")], stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2], text=True)
    assert parent.stdout is not None
    pid, port = (int(x) for x in parent.stdout.readline().split())
    assert pid_alive(pid) and _ping(port)

    parent.send_signal(signal.SIGKILL)
    parent.wait(10)

    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "redis outlived the process that started it"
