"""Fixtures for the ``quiver`` command and client against the real stack: uvicorn serving ``config.asgi`` in this
process (so the server side can count requests), PostgreSQL, Redis, the S3 server and a real Celery worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters_app.models import BaseModel
from adapters_app.services import base_model_register
from adapters_app.validation import BaseModelFacts
from devtools.synthetic_adapters import lora_tensors, peft_config, write_adapter
from tenants.models import Tenant
from tenants.services import api_key_create
from tests.factories import TenantFactory

QUIVER = Path(sys.executable).parent / "quiver"  # the console script `pip install -e clients/python` put there
MIB = 1024 * 1024
#: TinyLlama-1.1B's shapes: an r=16 fp32 LoRA on all seven projections is ~48 MiB, ten 5 MiB parts.
WIDE_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
              "num_key_value_heads": 4}
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Tenancy:
    """A fresh tenant with a full-scope key, and the environment the ``quiver`` command runs in."""

    tenant: Tenant
    key: str
    url: str
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: this server and key, a private HOME and state folder, no terminal."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
        return {**env, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"),
                "QUIVER_STATE_DIR": str(self.home / "state"), "QUIVER_URL": self.url, "QUIVER_API_KEY": self.key,
                "COLUMNS": "200", **extra}


@dataclass(frozen=True)
class Ran:
    """One ``quiver`` run: exit code and output."""

    rc: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as JSON."""
        return json.loads(self.stdout)


@pytest.fixture
def tenancy(gateway_server: str, celery_worker: None, tmp_path: Path) -> Tenancy:
    """A tenant and key on the running stack (the worker validates what is pushed)."""
    tenant = TenantFactory()
    _, key = api_key_create(tenant, name="cli")
    home = tmp_path / "home"
    home.mkdir()
    return Tenancy(tenant=tenant, key=key, url=gateway_server, home=home)


@pytest.fixture
def quiver(tenancy: Tenancy) -> Callable[..., Ran]:
    """``quiver(*args, env=None, stdin=None)`` runs the installed ``quiver`` command in a subprocess."""

    def run(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None, timeout: float = 300) -> Ran:
        proc = subprocess.run([str(QUIVER), *args], env=dict(env) if env is not None else tenancy.env(),
                              input=stdin if stdin is not None else "", capture_output=True, text=True, timeout=timeout)
        assert "Traceback" not in proc.stderr, proc.stderr  # errors are one line, never a traceback
        return Ran(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def server_requests() -> Iterator[list[tuple[str, str]]]:
    """``(method, path)`` of every request that reaches Django in this process's server, as it arrives."""
    from django.core.signals import request_started

    seen: list[tuple[str, str]] = []

    def record(sender: Any, scope: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if scope is not None:
            seen.append((str(scope.get("method")), str(scope.get("path"))))

    request_started.connect(record, weak=False, dispatch_uid="tests.clients.server_requests")
    try:
        yield seen
    finally:
        request_started.disconnect(dispatch_uid="tests.clients.server_requests")


@pytest.fixture
def wide_base() -> BaseModel:
    """Base model ``wide-llama`` with TinyLlama-1.1B's shapes (validation only: no engine serves it)."""
    return base_model_register(base_model_name="wide-llama", hf_config=WIDE_LLAMA, max_lora_rank=16)


def wide_adapter(folder: Path, *, seed: int = 0, r: int = 16) -> Path:
    """A valid ~48 MiB fp32 LoRA (rank ``r``, all seven projections) for ``wide-llama``."""
    base = BaseModelFacts.from_hf_config("wide-llama", WIDE_LLAMA)
    return write_adapter(folder, peft_config("wide-llama", r=r, lora_alpha=2 * r, target_modules=list(ALL_MODULES)),
                         lora_tensors(base, r=r, modules=ALL_MODULES, seed=seed))
