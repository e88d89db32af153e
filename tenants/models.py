"""Tenants, memberships and API keys.

API keys follow netbox-community/netbox ``netbox/users/models/tokens.py`` and PostHog's ``personal_api_key.py``:
only an HMAC-SHA256 digest of the secret is stored; the plaintext is shown once.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

# Single hyphens only: served names join slugs with `--` (`<tenant>--<adapter>--<pk>`), so a `--` inside one made
# them ambiguous. Checked on new names only (validators run on create); existing rows keep working.
slug_validator = RegexValidator(
    r"^(?=[a-z0-9-]{1,40}$)[a-z0-9]+(?:-[a-z0-9]+)*$",
    "Use 1-40 lowercase letters, digits or single hyphens, starting and ending with a letter or digit.",
)


# Priority classes → vLLM's request ``priority`` (lower runs first; 0 is the engine's default).
PRIORITY_CLASSES = {"high": -1, "normal": 0, "low": 1}
PRIORITY_CHOICES = [(name, name) for name in PRIORITY_CLASSES]


class RequestLimits(models.Model):
    """Gateway limits shared by tenants and keys; null = unlimited (enforced by ``inference.gateway.limits``).

    Units: requests per minute, tokens per minute (prompt + completion), requests in flight, and a cap on one
    request's ``max_tokens``. ``priority_class`` orders requests when nodes are saturated (``high`` before
    ``normal`` before ``low``; on the gateway's admission queue and, as vLLM's ``priority`` -1/0/1, in the engine's
    priority scheduler); null = ``normal`` on a tenant, the tenant's class on a key. A key never ranks above its
    tenant.
    """

    rpm_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_tokens_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    # null = unset (inherit), as null means "no limit" on the fields above
    priority_class = models.CharField(max_length=8, null=True, blank=True, choices=PRIORITY_CHOICES)  # noqa: DJ001

    class Meta:
        abstract = True


LIMIT_FIELDS = ("rpm_limit", "tpm_limit", "concurrency_limit", "max_tokens_limit", "priority_class")


class Tenant(RequestLimits):
    """A customer organisation; owns adapters, keys and usage. ``slug`` is part of served names."""

    slug = models.CharField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    max_adapters = models.PositiveIntegerField(default=100, validators=[MinValueValidator(0)])
    # Abuse limits, enforced under a lock on this row (adapters_app.services, tenants.services).
    max_versions_per_adapter = models.PositiveIntegerField(default=50)
    max_stored_bytes = models.PositiveBigIntegerField(default=20 * 1024**3)
    max_api_keys = models.PositiveIntegerField(default=50)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A Django user's role in a tenant, and the limits an owner set on the keys they mint (``key_limits``)."""

    class Role(models.TextChoices):
        OWNER = "owner"
        MEMBER = "member"
        VIEWER = "viewer"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    # The gateway limits an owner last set on one of this (non-owner) member's keys, by field (absent = none): every
    # key the member mints starts with them, so a fresh key does not escape them (tenants.services.api_key_create).
    key_limits = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_tenant_user")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.tenant_id}:{self.role}"


class Invitation(models.Model):
    """An owner's offer of a ``role`` in ``tenant`` to whoever holds ``username``; a membership only once that user
    accepts it in the console (``tenants.invitations``).

    Kept by username as typed, whether or not such a user exists, so the inviting owner learns nothing about which
    usernames exist (the same answer, the same row, for both). Pending until accepted, declined, cancelled, or past
    ``expires_at``.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "username"], name="invitation_unique_tenant_username")]
        indexes = [models.Index(fields=["username"], name="invitation_username")]

    def __str__(self) -> str:
        return f"{self.username}@{self.tenant_id}:{self.role}"


class ApiKey(RequestLimits):
    """A tenant API key ``<prefix>_<key_id>.<secret>``; ``digest`` = HMAC-SHA256(secret) in hex.

    ``scopes`` is a list drawn from :data:`tenants.scopes.ALL_SCOPES`; ``adapters`` narrows which models it can call
    (empty = all). ``last_used_at`` is written at most once per
    ``QUIVER_API_KEY_LAST_USED_INTERVAL_S`` seconds.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    key_id = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    name = models.CharField(max_length=100)
    scopes = models.JSONField(default=list)
    # The adapters this key may call, by name (every version) or ``name@N`` (that version only); empty = every
    # adapter and base model of the tenant. Any other model is a 404 ``model_not_found`` at the gateway.
    adapters = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    # The console playground's key of ``created_by`` in this tenant: one live row per user, whose secret is replaced
    # each time the console asks for it (``services.playground_key_issue``), so visits never add keys to the list.
    console_playground = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.masked

    @property
    def masked(self) -> str:
        """The key as shown after creation: its id with the secret hidden."""
        return f"{settings.QUIVER_API_KEY_PREFIX}_{self.key_id}.****"

    @property
    def adapter_names(self) -> frozenset[str]:
        """The adapter names ``adapters`` limits the key to (``"name@2"`` counts as ``"name"``); empty: no limit."""
        return frozenset(str(a).partition("@")[0] for a in self.adapters or ())


class LoginFailure(models.Model):
    """One failed console login, kept to throttle password guessing (``tenants.login_throttle``).

    ``username`` is lowercased as typed (it may name no user); ``ip`` is the client address Django saw.
    """

    username = models.CharField(max_length=150, db_index=True)
    ip = models.GenericIPAddressField(null=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.username}@{self.ip}"
