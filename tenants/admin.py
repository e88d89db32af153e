from django.contrib import admin

from tenants.models import ApiKey, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_adapters", "created_at")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("tenant", "user", "role")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("key_id", "tenant", "name", "enabled", "expires_at", "last_used_at")
    readonly_fields = ("key_id", "digest", "last_used_at", "revoked_at")
