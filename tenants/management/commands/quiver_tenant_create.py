"""``manage.py quiver_tenant_create <slug>``: make a tenant (if new) and mint an API key, printing the secret once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from tenants.models import Tenant
from tenants.services import api_key_create, tenant_create


class Command(BaseCommand):
    help = "Create a tenant (if missing) and print a new API key for it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default=None)
        parser.add_argument("--key-name", default="default")

    def handle(self, *args: Any, slug: str, name: str | None, key_name: str, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(slug=slug, name=name or slug)
        _, plaintext = api_key_create(tenant, name=key_name)
        self.stdout.write(plaintext)
