from django.contrib import admin

from inference.fleet.models import Node, Placement


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "base_model", "healthy", "last_heartbeat_at", "kv_cache_usage_perc", "num_requests_waiting")


@admin.register(Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ("adapter_version", "node", "tier", "pinned", "updated_at")
