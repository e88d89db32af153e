from django.contrib import admin

from inference.metering.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("tenant", "adapter_version", "endpoint", "status_code", "prompt_tokens", "completion_tokens")
