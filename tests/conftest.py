"""Root fixtures. Backing services (PostgreSQL, Redis, S3) come from env, started by ``devtools.services`` when absent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from adapters_app.chat_template import chat_template_from_files, special_tokens_from_config
from adapters_app.models import BaseModel
from adapters_app.services import base_model_register
from tenants.models import Tenant
from tenants.services import api_key_create, membership_create
from tests.factories import TenantFactory


@pytest.fixture
def base_model(tiny_base_dir: Path) -> BaseModel:
    """The tiny Llama registered as base model ``tiny-llama`` (max_lora_rank 16, as the test engine), with its
    tokenizer and chat template as ``quiver_base_model_register`` stores them."""
    config = json.loads((tiny_base_dir / "config.json").read_text())
    tokenizer_config = json.loads((tiny_base_dir / "tokenizer_config.json").read_text())
    jinja = tiny_base_dir / "chat_template.jinja"
    return base_model_register(base_model_name="tiny-llama", hf_config=config, max_lora_rank=16,
                               tokenizer_json=(tiny_base_dir / "tokenizer.json").read_text(),
                               chat_template=chat_template_from_files(
                                   jinja.read_text() if jinja.is_file() else None, tokenizer_config),
                               special_tokens=special_tokens_from_config(tokenizer_config))


@pytest.fixture
def make_client() -> Callable[..., tuple[APIClient, Tenant, str]]:
    """``make_client(slug=None, scopes=...)`` → ``(client, tenant, plaintext key)`` for a fresh tenant."""

    def make(slug: str | None = None, **key_kwargs: object) -> tuple[APIClient, Tenant, str]:
        tenant = TenantFactory(slug=slug) if slug else TenantFactory()
        _, plaintext = api_key_create(tenant, name="test", **key_kwargs)  # type: ignore[arg-type]
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        return client, tenant, plaintext

    return make


@pytest.fixture
def make_session_client(django_user_model: Any) -> Callable[..., tuple[APIClient, Tenant, Any]]:
    """``make_session_client(role="owner")`` → ``(client, tenant, user)``: a console session of a fresh tenant's user."""

    def make(slug: str | None = None, role: str = "owner") -> tuple[APIClient, Tenant, Any]:
        tenant = TenantFactory(slug=slug) if slug else TenantFactory()
        user = django_user_model.objects.create_user(username=f"{role}-{tenant.slug}", password="pw-not-used")
        membership_create(tenant, user=user, role=role)
        client = APIClient()
        client.force_login(user)
        return client, tenant, user

    return make

pytest_plugins = ["tests.fixtures.vllm", "tests.fixtures.stack"]


def pytest_configure(config: pytest.Config) -> None:
    """Transactional tests' flush survives a deadlock with the live stack's writers (tests.fixtures.flush_retry)."""
    from tests.fixtures import flush_retry

    flush_retry.install()



def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the browser journeys last.

    Playwright's sync API keeps an event loop running in the main thread for as long as its session-scoped
    browser lives, and every later test that calls ``asyncio.run`` (or Django's async_to_sync) then fails with
    "cannot be called from a running event loop". Keeping the journeys at the end keeps one session, one engine.
    """
    console = Path(__file__).resolve().parent / "console"
    items.sort(key=lambda item: Path(str(item.path)).is_relative_to(console))
