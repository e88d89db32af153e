from django.apps import AppConfig


class MeteringConfig(AppConfig):
    """Metering: usage records and rollups, their ingest from the Redis stream, the usage and traffic APIs."""

    name = "inference.metering"
    label = "metering"
    default_auto_field = "django.db.models.BigAutoField"
