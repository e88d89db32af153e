from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The data plane's Django side: nodes, placements, the OpenAI-compatible gateway and metering."""

    name = "inference.gateway"
    label = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the cache-invalidation receivers (``inference.gateway.signals``) and the fleet's answers to the
        adapter registry (``inference.gateway.registry_events``)."""
        from inference.gateway import registry_events, signals

        signals.connect()
        registry_events.connect()
