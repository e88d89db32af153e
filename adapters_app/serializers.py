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


class AdapterOutputSerializer(serializers.ModelSerializer):
    """Output: an adapter with its newest version (any status), the version that serves, and its residency.

    ``residency`` counts replicas of the adapter's versions per tier (``{"hot": 1, "staged": 2}``) from the view's
    ``residency`` context; node names never reach tenants.
    """
    base_model = serializers.CharField(source="base_model.base_model_name")
    latest_version = serializers.SerializerMethodField()
    serving_version = serializers.SerializerMethodField()
    residency = serializers.SerializerMethodField()

    class Meta:
        model = Adapter
        fields = ["name", "base_model", "description", "created_at", "latest_version", "serving_version", "residency"]

    def _versions(self, obj: Adapter) -> list[AdapterVersion]:
        prefetched = getattr(obj, "versions_newest_first", None)
        return list(prefetched) if prefetched is not None else list(obj.versions.order_by("-number"))

    def get_serving_version(self, obj: Adapter) -> int | None:
        """The number of the newest ``ready`` version (what ``model=<name>`` serves), or None."""
        return next((v.number for v in self._versions(obj) if v.status == AdapterVersion.Status.READY), None)

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
