from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0009_apikey_adapters'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='console_playground',
            field=models.BooleanField(default=False),
        ),
    ]
