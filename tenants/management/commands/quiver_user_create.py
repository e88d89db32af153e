"""``manage.py quiver_user_create <username>``: a console login (password from env), optionally staff or a member.

The password is read from the environment variable named by ``--password-env`` (default ``QUIVER_USER_PASSWORD``),
so it never shows in the process list; it must pass ``AUTH_PASSWORD_VALIDATORS`` (12 characters or more, not a
common or all-digit password) and Django hashes it. Re-running updates the password and adds the membership.
"""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tenants.models import Membership, Tenant
from tenants.services import membership_create


class Command(BaseCommand):
    help = "Create or update a console user; --tenant/--role add a membership, --staff makes an operator."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--password-env", default="QUIVER_USER_PASSWORD")
        parser.add_argument("--email", default="")
        parser.add_argument("--staff", action="store_true")
        parser.add_argument("--tenant", default=None)
        parser.add_argument("--role", default=Membership.Role.MEMBER, choices=Membership.Role.values)

    def handle(self, *args: Any, username: str, password_env: str, email: str, staff: bool, tenant: str | None,
               role: str, **options: Any) -> None:
        password = os.environ.get(password_env)
        if not password:
            raise CommandError(f"Set the password in the environment variable {password_env}.")
        user = User.objects.filter(username=username).first() or User(username=username)
        user.email = email or user.email
        user.is_staff = staff or user.is_staff
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(f"The password in {password_env} is too weak: {' '.join(exc.messages)} "
                               "Choose a longer, uncommon one (e.g. python -c 'import secrets; "
                               "print(secrets.token_urlsafe(16))').") from None
        user.set_password(password)
        user.save()
        if tenant:
            t = Tenant.objects.filter(slug=tenant).first()
            if t is None:
                raise CommandError(f"No tenant '{tenant}'; create it with quiver_tenant_create first.")
            membership = Membership.objects.filter(tenant=t, user=user).first()
            if membership is None:
                membership_create(t, user=user, role=role)
            elif membership.role != role:
                membership.role = role
                membership.save(update_fields=["role"])
        self.stdout.write(username)
