"""Operator-set capacity ceilings on nodes (``quiver_node_register --max-loras/--max-cpu-loras/--max-lora-rank``),
null = the fleet's default. Nullable columns without a default: PostgreSQL adds them without rewriting the table.
The effective figures (``Node.max_loras`` ...) are clamped on each node's next heartbeat.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0003_change_stamps'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='max_loras_ceiling',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='max_cpu_loras_ceiling',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='max_lora_rank_ceiling',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
