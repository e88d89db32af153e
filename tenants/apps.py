from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants, members and roles, API keys, quotas."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the OpenAPI description of API-key auth."""
        from tenants import schema  # noqa: F401
