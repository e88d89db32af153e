from django.apps import AppConfig


class FleetConfig(AppConfig):
    """The fleet control plane: nodes, placements, desired state, the audit log, warm/evict, plan and reconcile."""

    name = "inference.fleet"
    label = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the fleet's answers to the adapter registry's events (``inference.fleet.registry_events``)."""
        from inference.fleet import registry_events

        registry_events.connect()
