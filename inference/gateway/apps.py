from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The request path's Django side: ``/v1/models``, cache invalidations. It owns no model today; its migrations
    are the history of the tables the fleet and metering apps took over (``db_table`` kept)."""

    name = "inference.gateway"
    label = "gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the cache-invalidation receivers (``inference.gateway.signals``)."""
        from inference.gateway import signals

        signals.connect()
