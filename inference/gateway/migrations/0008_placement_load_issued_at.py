"""``Placement.load_issued_at``: heartbeats record a version on a node only after the control plane asked for it.

Rows that exist before this migration were written by warms, pins or heartbeats of the trusting code; they are kept
as issued (at their last update) so that upgrading drops nothing that is routed now.
"""

from django.db import migrations, models
from django.db.models import F


def _trust_existing_rows(apps, schema_editor):  # type: ignore[no-untyped-def]
    placement = apps.get_model("gateway", "Placement")
    placement.objects.filter(load_issued_at__isnull=True).update(load_issued_at=F("updated_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0007_usage_rollup'),
    ]

    operations = [
        migrations.AddField(
            model_name='placement',
            name='load_issued_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(_trust_existing_rows, migrations.RunPython.noop),
    ]
