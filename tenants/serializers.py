"""Input/output serializers for API keys: shape only, no rules (conventions §6)."""

from __future__ import annotations

from rest_framework import serializers

from tenants.models import LIMIT_FIELDS, PRIORITY_CLASSES, ApiKey
from tenants.scopes import ALL_SCOPES

# An adapter name (1-40 lowercase letters, digits or single hyphens) with an optional version, `@N` (N ≥ 1).
ADAPTER_REF_RE = r"^(?=[a-z0-9-]{1,40}(?:@|$))[a-z0-9]+(?:-[a-z0-9]+)*(?:@[1-9][0-9]{0,8})?$"
ADAPTER_REF_RULE = ('"%(value)s" is not an adapter name: use 1-40 lowercase letters, digits or single hyphens, '
                    'starting and ending with a letter or digit, optionally followed by @N to allow version N alone '
                    '(e.g. support-bot or ranker@2).')

# PostgreSQL's integer (PositiveIntegerField): past it the write is a DataError, a 500, not a 400.
PG_INT_MAX = 2**31 - 1


class LimitsSerializer(serializers.Serializer):
    """Gateway limits (``PATCH``: any subset; null = unlimited): requests/min, tokens/min, requests in flight, and
    the cap on one request's ``max_tokens``."""
    rpm_limit = serializers.IntegerField(min_value=1, max_value=PG_INT_MAX, allow_null=True, required=False)
    tpm_limit = serializers.IntegerField(min_value=1, max_value=PG_INT_MAX, allow_null=True, required=False)
    concurrency_limit = serializers.IntegerField(min_value=1, max_value=PG_INT_MAX, allow_null=True, required=False)
    max_tokens_limit = serializers.IntegerField(min_value=1, max_value=PG_INT_MAX, allow_null=True, required=False)
    priority_class = serializers.ChoiceField(
        choices=list(PRIORITY_CLASSES), allow_null=True, required=False,
        help_text="high, normal or low: the order under saturation.",
        error_messages={"invalid_choice": f'"{{input}}" is not a priority class; use one of: '
                                          f'{", ".join(PRIORITY_CLASSES)}.'})


class ApiKeyInputSerializer(LimitsSerializer):
    """Input of ``POST /api/v1/api-keys``: ``name``, non-empty ``scopes`` (absent: every scope the caller may grant),
    optional ``expires_at`` and ``adapters`` (the models the key may call at the gateway: adapter names or
    ``name@N``; empty = all), and the key's gateway limits (:class:`LimitsSerializer`'s fields; never looser than
    what binds the caller)."""
    name = serializers.CharField(max_length=100)
    # DRF's default, '"admin" is not a valid choice.', left the caller guessing what a valid one is.
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ALL_SCOPES, error_messages={
            "invalid_choice": f'"{{input}}" is not a scope; the scopes are: {", ".join(ALL_SCOPES)}.'}),
        required=False, allow_empty=False,
        help_text=f"Any of {list(ALL_SCOPES)}; absent: every scope the caller may grant (all yours).")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    # The adapters' own naming rule (tenants.models.slug_validator), with an optional @N: DRF's "This value does not
    # match the required pattern." left the caller to guess the rule, and a looser pattern let through names
    # (`a--b`) no adapter can have.
    adapters = serializers.ListField(
        child=serializers.RegexField(ADAPTER_REF_RE, error_messages={"invalid": ADAPTER_REF_RULE}),
        required=False, default=list, max_length=100,
        help_text="Adapter names, or name@N for version N only; empty = every model of the tenant.")


class ApiKeyOutputSerializer(serializers.ModelSerializer):
    """Output: a key's metadata with its masked form and limits; never the secret or digest."""
    key = serializers.CharField(source="masked")
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=ALL_SCOPES))
    adapters = serializers.ListField(child=serializers.CharField(),
                                     help_text="models this key may call (names or name@N); empty = all")

    class Meta:
        model = ApiKey
        fields = ["key_id", "key", "name", "scopes", "adapters", "enabled", "expires_at", "last_used_at", "revoked_at",
                  "created_at", "console_playground", *LIMIT_FIELDS]


class ApiKeyCreatedSerializer(ApiKeyOutputSerializer):
    """Output of ``POST /api/v1/api-keys``: the key plus its ``secret``, shown this once, and which of its
    ``adapters`` name nothing of the tenant yet (allowed: a key may be made before the adapters it calls)."""
    secret = serializers.CharField()
    adapters_not_found = serializers.ListField(
        child=serializers.CharField(),
        help_text="entries of `adapters` (name or name@N) with no such adapter or version yet; [] when all exist")
    warning = serializers.CharField(allow_null=True,
                                    help_text="a sentence about `adapters_not_found` for people; null when it is []")

    class Meta(ApiKeyOutputSerializer.Meta):
        fields = [*ApiKeyOutputSerializer.Meta.fields, "secret", "adapters_not_found", "warning"]
