from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The data plane's Django side: nodes, placements, the OpenAI-compatible gateway and metering."""

    name = "inference.gateway"
    label = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the cache-invalidation receivers (``inference.gateway.signals``)."""
        from inference.gateway import signals

        signals.connect()
