"""Input/output serializers for API keys: shape only, no rules (conventions §6)."""

from __future__ import annotations

from rest_framework import serializers

from tenants.models import ApiKey
from tenants.scopes import ALL_SCOPES


class ApiKeyInputSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/api-keys``: ``name``, non-empty ``scopes``, optional ``expires_at``."""
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ALL_SCOPES), required=False, default=list(ALL_SCOPES), allow_empty=False
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class ApiKeyOutputSerializer(serializers.ModelSerializer):
    """Output: a key's metadata with its masked form; never the secret or digest."""
    key = serializers.CharField(source="masked")
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=ALL_SCOPES))

    class Meta:
        model = ApiKey
        fields = ["key_id", "key", "name", "scopes", "enabled", "expires_at", "last_used_at", "revoked_at", "created_at"]


class ApiKeyCreatedSerializer(ApiKeyOutputSerializer):
    """Output of ``POST /api/v1/api-keys``: the key plus its ``secret``, shown this once."""
    secret = serializers.CharField()

    class Meta(ApiKeyOutputSerializer.Meta):
        fields = [*ApiKeyOutputSerializer.Meta.fields, "secret"]
