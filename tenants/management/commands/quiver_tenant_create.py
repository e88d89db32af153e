"""``manage.py quiver_tenant_create <slug>``: make a tenant (if new) and mint an API key, printing the secret once.

Output contract: stdout is the key alone, on its last line (``demo/run.py`` and ``scripts/*`` read
``.splitlines()[-1]``); what the key is goes to stderr first, so a person sees it and a pipe captures only the key.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from common.exceptions import QuiverError
from tenants.models import Tenant
from tenants.services import api_key_create, tenant_create


class Command(BaseCommand):
    help = ("Create a tenant (if missing) and mint a new API key for it. stdout is the key alone (qv_<id>.<secret>), "
            "shown only this once; the line saying what it is goes to stderr.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default=None)
        parser.add_argument("--key-name", default="default")

    def handle(self, *args: Any, slug: str, name: str | None, key_name: str, **options: Any) -> None:
        # One transaction: a key that cannot be minted leaves no new, keyless tenant behind.
        with transaction.atomic():
            tenant = Tenant.objects.filter(slug=slug).first()
            created = tenant is None
            if tenant is None:
                try:
                    tenant = tenant_create(slug=slug, name=name or slug)
                except ValidationError as exc:  # a clear line instead of a traceback, naming the field
                    raise CommandError(f"Tenant not created: {_problems(exc, slug=slug, name=name or slug)}") from exc
            try:
                _, plaintext = api_key_create(tenant, name=key_name)
            except ValidationError as exc:
                raise CommandError(f"Key not created: {_problems(exc, name=key_name)}") from exc
            except QuiverError as exc:  # quota_exceeded: the tenant's max_api_keys
                raise CommandError(f"Key not created: {exc.detail}") from exc
        state = "new tenant" if created else "existing tenant"
        # Unstyled: Django paints stderr red on a terminal, and this line is no error.
        self.stderr.write(f"API key {key_name!r} for {state} {tenant.slug} (shown once; store it now; clients send "
                          "it as 'Authorization: Bearer <key>'):", style_func=str)
        self.stdout.write(plaintext)


def _problems(exc: ValidationError, **given: str) -> str:
    """``field 'value': message`` for each field of ``exc`` (values clipped: they are echoed to a terminal)."""
    if not hasattr(exc, "error_dict"):
        return " ".join(exc.messages)
    return "; ".join(f"{field} {given.get(field, '')[:60]!r}: {' '.join(messages)}"
                     for field, messages in exc.message_dict.items())
