"""The gateway app hands its models to the fleet and metering apps (state only; the tables stay as they are)."""

from django.db import migrations

FLEET = ("node", "placement", "versionintent", "tenantresidencyquota", "fleetauditrecord", "nodesample")
METERING = ("usagerecord", "usagerollup")


def content_types_follow(apps, schema_editor, *, back: bool = False):  # type: ignore[no-untyped-def]
    """Move the models' content types (and so their permissions and admin log entries) to their new apps."""
    content_type = apps.get_model("contenttypes", "ContentType")
    for label, models in (("fleet", FLEET), ("metering", METERING)):
        old, new = ("gateway", label) if not back else (label, "gateway")
        content_type.objects.filter(app_label=old, model__in=models).update(app_label=new)


def content_types_back(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Undo :func:`content_types_follow` (migrating back to the gateway's models)."""
    content_types_follow(apps, schema_editor, back=True)


class Migration(migrations.Migration):

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('metering', '0001_initial'),
        ('fleet', '0001_initial'),
        ('gateway', '0008_placement_load_issued_at'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='FleetAuditRecord',
                ),
                migrations.RemoveField(
                    model_name='usagerecord',
                    name='node',
                ),
                migrations.RemoveField(
                    model_name='placement',
                    name='node',
                ),
                migrations.RemoveField(
                    model_name='nodesample',
                    name='node',
                ),
                migrations.RemoveField(
                    model_name='placement',
                    name='adapter_version',
                ),
                migrations.RemoveField(
                    model_name='tenantresidencyquota',
                    name='tenant',
                ),
                migrations.RemoveField(
                    model_name='usagerecord',
                    name='adapter_version',
                ),
                migrations.RemoveField(
                    model_name='usagerecord',
                    name='api_key',
                ),
                migrations.RemoveField(
                    model_name='usagerecord',
                    name='base_model',
                ),
                migrations.RemoveField(
                    model_name='usagerecord',
                    name='tenant',
                ),
                migrations.RemoveField(
                    model_name='usagerollup',
                    name='adapter_version',
                ),
                migrations.RemoveField(
                    model_name='usagerollup',
                    name='tenant',
                ),
                migrations.RemoveField(
                    model_name='versionintent',
                    name='adapter_version',
                ),
                migrations.DeleteModel(
                    name='Node',
                ),
                migrations.DeleteModel(
                    name='NodeSample',
                ),
                migrations.DeleteModel(
                    name='Placement',
                ),
                migrations.DeleteModel(
                    name='TenantResidencyQuota',
                ),
                migrations.DeleteModel(
                    name='UsageRecord',
                ),
                migrations.DeleteModel(
                    name='UsageRollup',
                ),
                migrations.DeleteModel(
                    name='VersionIntent',
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_back),
    ]
