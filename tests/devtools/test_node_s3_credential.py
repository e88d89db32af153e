"""Inference nodes hold a read-only S3 credential (issue 30 point 4), tried against a real SeaweedFS.

The node's credential is the one the demo hands its engine and agent (``demo.run.node_process_env``) and the one
``devtools.services`` exports to the tests' agents (``QUIVER_NODE_S3_ACCESS_KEY``): it may GET adapter objects
under ``tenants/`` and nothing else — no listing, no write, no delete, no bucket operation, no object elsewhere.
The control plane's own key keeps every action.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from demo.run import node_process_env
from devtools.seaweedfs import S3Service, s3_client, start_seaweedfs
from inference.node.cache import AdapterCache, FileSpec

ADAPTER_KEY = "tenants/7/uploads/0123abcd/adapter_model.safetensors"
OTHER_TENANT_KEY = "tenants/8/uploads/4567ef01/adapter_config.json"
OUTSIDE_KEY = "ops/backup.json"
BODY = b"\x00weights\x01" * 100


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Service]:
    """A SeaweedFS started exactly as the demo starts it, with one object per kind of key."""
    service = start_seaweedfs(tmp_path_factory.mktemp("node-s3"), bucket="quiver")
    admin = service.client()
    for key in (ADAPTER_KEY, OTHER_TENANT_KEY, OUTSIDE_KEY):
        admin.put_object(Bucket=service.bucket, Key=key, Body=BODY)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def node(s3: S3Service) -> Any:
    """A boto3 client built from the environment the demo gives its node processes."""
    env = node_process_env({"DJANGO_SECRET_KEY": "x", "DATABASE_URL": "sqlite://", "PATH": "/bin"}, s3)
    assert "DJANGO_SECRET_KEY" not in env and "DATABASE_URL" not in env
    assert env["AWS_ACCESS_KEY_ID"] == s3.node_access_key != s3.access_key
    return s3_client(env["AWS_S3_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])


def _refused(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return str(caught.value.response.get("Error", {}).get("Code"))


def test_the_node_reads_adapter_objects(s3: S3Service, node: Any, tmp_path: Path) -> None:
    assert node.get_object(Bucket=s3.bucket, Key=ADAPTER_KEY)["Body"].read() == BODY
    # Through the agent's own download path (inference.node.cache), verifying sha256 as it streams.
    cache = AdapterCache(tmp_path / "cache", node, s3.bucket)
    spec = FileSpec("adapter_model.safetensors", ADAPTER_KEY, hashlib.sha256(BODY).hexdigest(), len(BODY))
    staged = cache.stage("acme--bot", 3, [spec])
    assert (staged.path / "adapter_model.safetensors").read_bytes() == BODY


def test_the_node_can_neither_list_write_nor_delete(s3: S3Service, node: Any) -> None:
    bucket = s3.bucket
    assert _refused(node.list_objects_v2, Bucket=bucket) == "AccessDenied"
    assert _refused(node.list_objects_v2, Bucket=bucket, Prefix="tenants/") == "AccessDenied"
    assert _refused(node.put_object, Bucket=bucket, Key=ADAPTER_KEY, Body=b"poisoned") == "AccessDenied"
    assert _refused(node.put_object, Bucket=bucket, Key="tenants/9/new", Body=b"x") == "AccessDenied"
    assert _refused(node.create_multipart_upload, Bucket=bucket, Key="tenants/9/big") == "AccessDenied"
    assert _refused(node.copy_object, Bucket=bucket, Key="tenants/9/copy",
                    CopySource={"Bucket": bucket, "Key": ADAPTER_KEY}) == "AccessDenied"
    assert _refused(node.delete_object, Bucket=bucket, Key=ADAPTER_KEY) == "AccessDenied"
    assert _refused(node.put_bucket_cors, Bucket=bucket, CORSConfiguration={"CORSRules": [
        {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}]}) == "AccessDenied"
    assert _refused(node.delete_bucket, Bucket=bucket) == "AccessDenied"
    # Nothing changed: the control plane still reads the original bytes.
    assert s3.client().get_object(Bucket=bucket, Key=ADAPTER_KEY)["Body"].read() == BODY


def test_a_multi_object_delete_removes_nothing(s3: S3Service, node: Any) -> None:
    try:
        answer = node.delete_objects(Bucket=s3.bucket, Delete={"Objects": [{"Key": ADAPTER_KEY},
                                                                         {"Key": OTHER_TENANT_KEY}]})
    except ClientError as exc:  # refused as a whole
        assert exc.response["Error"]["Code"] == "AccessDenied"
    else:  # or per key: every key an error, none deleted
        assert not answer.get("Deleted"), answer
        assert {e["Code"] for e in answer.get("Errors", [])} == {"AccessDenied"}
    for key in (ADAPTER_KEY, OTHER_TENANT_KEY):
        assert s3.client().head_object(Bucket=s3.bucket, Key=key)["ContentLength"] == len(BODY)


def test_the_node_reads_nothing_outside_the_adapter_prefix(s3: S3Service, node: Any) -> None:
    assert _refused(node.get_object, Bucket=s3.bucket, Key=OUTSIDE_KEY) == "AccessDenied"


def test_the_tests_agents_get_the_node_credential_too() -> None:
    # devtools.services exports it for the agents the test stack starts (tests.fixtures.stack.agent_env).
    from tests.fixtures.stack import node_s3_env

    env = node_s3_env()
    assert env["AWS_ACCESS_KEY_ID"] == os.environ["QUIVER_NODE_S3_ACCESS_KEY"]
    assert env["AWS_ACCESS_KEY_ID"] != os.environ["AWS_ACCESS_KEY_ID"]
    node = s3_client(env["AWS_S3_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    assert _refused(node.list_objects_v2, Bucket=env["AWS_STORAGE_BUCKET_NAME"]) == "AccessDenied"
