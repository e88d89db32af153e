"""Input/output serializers for the adapter registry API (shape only; rules live in services)."""

from __future__ import annotations

from rest_framework import serializers

from adapters_app.models import Adapter, AdapterVersion, BaseModel


class BaseModelOutputSerializer(serializers.ModelSerializer):
    """Output: a registered base model and its pool's engine limits."""
    class Meta:
        model = BaseModel
        fields = ["base_model_name", "architecture", "node_pool", "max_lora_rank", "max_adapter_bytes"]


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

    def get_files(self, obj: AdapterVersion) -> list[dict]:
        """Files as ``[{name, size (bytes), sha256}]``; S3 keys are internal."""
        # S3 keys are internal: tenants see names, sizes and digests.
        return [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in obj.files]


class AdapterOutputSerializer(serializers.ModelSerializer):
    """Output: an adapter with its newest version (any status)."""
    base_model = serializers.CharField(source="base_model.base_model_name")
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Adapter
        fields = ["name", "base_model", "description", "created_at", "latest_version"]

    def get_latest_version(self, obj: Adapter) -> dict | None:
        """The highest-numbered version, or None before the first upload."""
        prefetched = getattr(obj, "versions_newest_first", None)
        version = prefetched[0] if prefetched else (None if prefetched == [] else obj.versions.order_by("-number").first())
        return AdapterVersionOutputSerializer(version).data if version else None
