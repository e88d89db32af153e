from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    """Base models, adapters, immutable adapter versions, artifacts in S3, validation reports.

    ``label = "adapters"`` so tables read ``adapters_*`` (conventions, "Decided choices").
    """

    name = "adapters_app"
    label = "adapters"
    default_auto_field = "django.db.models.BigAutoField"
