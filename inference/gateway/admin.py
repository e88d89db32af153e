from django.contrib import admin

from inference.gateway.models import Node, Placement, UsageRecord


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "base_model", "healthy", "last_heartbeat_at", "kv_cache_usage_perc", "num_requests_waiting")


@admin.register(Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ("adapter_version", "node", "tier", "pinned", "updated_at")


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("tenant", "adapter_version", "endpoint", "status_code", "prompt_tokens", "completion_tokens")
