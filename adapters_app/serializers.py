"""Input/output serializers for the adapter registry API (shape only; rules live in services)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from adapters_app.models import Adapter, AdapterVersion, BaseModel


class BaseModelOutputSerializer(serializers.ModelSerializer):
    """Output: a registered base model, its pool's engine limits and ``facts`` (``BaseModelFacts.to_dict()``: the
    shapes the validator checks adapters against), so clients run the same validator before uploading."""
    class Meta:
        model = BaseModel
        fields = ["base_model_name", "architecture", "node_pool", "max_lora_rank", "max_adapter_bytes", "facts"]


class AdapterInputSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/adapters``: ``name`` (slug), ``base_model`` (registered name), ``description``."""
    name = serializers.CharField(max_length=40)
    base_model = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class AdapterVersionOutputSerializer(serializers.ModelSerializer):
    """Output: one version with its status, PEFT facts and validation report (S3 keys hidden)."""
    adapter = serializers.CharField(source="adapter.name")
    files = serializers.SerializerMethodField()

    class Meta:
        model = AdapterVersion
        fields = [
            "adapter", "number", "status", "sha256", "size_bytes", "files", "r", "lora_alpha", "target_modules",
            "validation_report", "created_at", "validated_at",
        ]

    @extend_schema_field({"type": "array", "items": {"type": "object", "required": ["name", "size", "sha256"],
                          "properties": {"name": {"type": "string"}, "size": {"type": "integer"},
                                         "sha256": {"type": "string"}}}})
    def get_files(self, obj: AdapterVersion) -> list[dict]:
        """Files as ``[{name, size (bytes), sha256}]``; S3 keys are internal."""
        # S3 keys are internal: tenants see names, sizes and digests.
        return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in obj.files]


class RuleEntrySerializer(serializers.Serializer):
    """One version's share of an adapter's traffic: ``version`` (number) and ``weight`` (whole percent)."""
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)
    weight = serializers.IntegerField(min_value=0, max_value=100)


class AdapterOutputSerializer(serializers.ModelSerializer):
    """Output: an adapter with its newest version (any status), the version that serves, and its residency.

    ``residency`` counts replicas of the adapter's versions per tier (``{"hot": 1, "staged": 2}``) from the view's
    ``residency`` context; node names never reach tenants.
    """
    base_model = serializers.CharField(source="base_model.base_model_name")
    latest_version = serializers.SerializerMethodField()
    serving_version = serializers.SerializerMethodField()
    serving_rule = serializers.SerializerMethodField()
    residency = serializers.SerializerMethodField()

    class Meta:
        model = Adapter
        fields = ["name", "base_model", "description", "created_at", "latest_version", "serving_version",
                  "serving_rule", "auto_promote", "residency"]

    def _versions(self, obj: Adapter) -> list[AdapterVersion]:
        prefetched = getattr(obj, "versions_newest_first", None)
        return list(prefetched) if prefetched is not None else list(obj.versions.order_by("-number"))

    def get_serving_version(self, obj: Adapter) -> int | None:
        """The number of the version that takes the largest share of ``model=<name>`` (its serving rule's heaviest
        ready version; the first ready one while the rule names none), or None before any version is ready."""
        ready = {v.number for v in self._versions(obj) if v.status == AdapterVersion.Status.READY}
        in_rule = [entry[0] for entry in (obj.serving_rule or []) if entry and entry[0] in ready]
        return in_rule[0] if in_rule else (min(ready) if ready else None)

    @extend_schema_field(RuleEntrySerializer(many=True))
    def get_serving_rule(self, obj: Adapter) -> list[dict[str, int]]:
        """Which versions ``model=<name>`` reaches, ``[{version, weight}]`` heaviest first: the rule's ready versions,
        else the first ready version, as the gateway reads it (empty before the first ready version)."""
        ready = {v.number for v in self._versions(obj) if v.status == AdapterVersion.Status.READY}
        rule = [{"version": v, "weight": w} for v, w in (obj.serving_rule or []) if v in ready and w > 0]
        return rule or ([{"version": min(ready), "weight": 100}] if ready else [])

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_residency(self, obj: Adapter) -> dict[str, int]:
        """Replica counts per tier, e.g. ``{"hot": 1}``; empty when nothing is placed."""
        return dict(self.context.get("residency", {}).get(obj.pk, {}))

    @extend_schema_field(AdapterVersionOutputSerializer(allow_null=True))
    def get_latest_version(self, obj: Adapter) -> dict | None:
        """The highest-numbered version, or None before the first upload."""
        prefetched = getattr(obj, "versions_newest_first", None)
        version = prefetched[0] if prefetched else (None if prefetched == [] else obj.versions.order_by("-number").first())
        return AdapterVersionOutputSerializer(version).data if version else None


class ServingChangeSerializer(serializers.Serializer):
    """One audited change of the serving rule or settings: who (username, ``key:<id>`` or ``system``; ``key_name``:
    that key's name, null for any other actor or a key no longer stored), what, when, before → after (rules as
    ``[[version, weight], ...]``)."""
    actor = serializers.CharField()
    key_name = serializers.CharField(allow_null=True)
    action = serializers.CharField()
    before = serializers.JSONField()
    after = serializers.JSONField()
    created_at = serializers.DateTimeField()


class ServingOutputSerializer(serializers.Serializer):
    """An adapter's serving state: the rule ``model = "<name>"`` follows, the rule a rollback returns to, the
    settings, the latest changes (newest first, at most 20), and after a change each joining version's warm state
    (``warm``, ``cold``, ``no_node``) and when the new rule began to serve."""
    adapter = serializers.CharField()
    rule = RuleEntrySerializer(many=True)
    previous_rule = RuleEntrySerializer(many=True, allow_null=True)
    auto_promote = serializers.BooleanField()
    rpm_limit = serializers.IntegerField(allow_null=True)
    tpm_limit = serializers.IntegerField(allow_null=True)
    history = ServingChangeSerializer(many=True)
    warm = serializers.DictField(child=serializers.CharField(), required=False)
    serving_since = serializers.DateTimeField(allow_null=True, required=False)


class ServingSettingsInputSerializer(serializers.Serializer):
    """Input of ``PATCH .../serving``: ``auto_promote`` (each new ready version takes all traffic), ``rpm_limit``,
    ``tpm_limit`` (the adapter's own gateway limits; null = unlimited)."""
    auto_promote = serializers.BooleanField(required=False)
    rpm_limit = serializers.IntegerField(min_value=1, max_value=2**31 - 1, allow_null=True, required=False)
    tpm_limit = serializers.IntegerField(min_value=1, max_value=2**31 - 1, allow_null=True, required=False)


class PromoteInputSerializer(serializers.Serializer):
    """Input of ``POST .../promote``: the ready ``version`` (number) to send all traffic to."""
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class CanaryInputSerializer(serializers.Serializer):
    """Input of ``POST .../canary``: either ``version`` and ``percent`` (that share to it, the rest to the current
    rule's heaviest version; 0 ends the canary) or a whole ``split`` (``[{version, weight}]`` summing to 100)."""
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1, required=False)
    percent = serializers.IntegerField(min_value=0, max_value=100, required=False)
    split = RuleEntrySerializer(many=True, required=False)

    def validate(self, attrs: dict) -> dict:
        """Exactly one of ``split`` or ``version`` + ``percent``."""
        if "split" in attrs and ("version" in attrs or "percent" in attrs):
            raise serializers.ValidationError("Send either 'split' or 'version' and 'percent', not both.")
        if "split" not in attrs and ("version" not in attrs or "percent" not in attrs):
            raise serializers.ValidationError("Send 'version' and 'percent', or a 'split'.")
        return attrs
