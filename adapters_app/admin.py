from django.contrib import admin

from adapters_app.models import Adapter, AdapterVersion, BaseModel


@admin.register(BaseModel)
class BaseModelAdmin(admin.ModelAdmin):
    list_display = ("base_model_name", "architecture", "node_pool", "max_lora_rank")


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "base_model", "created_at")


@admin.register(AdapterVersion)
class AdapterVersionAdmin(admin.ModelAdmin):
    list_display = ("adapter", "number", "status", "sha256", "size_bytes", "created_at")
    readonly_fields = ("sha256", "size_bytes", "files", "s3_prefix", "validation_report")
