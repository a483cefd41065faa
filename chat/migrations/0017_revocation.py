from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0016_key_endpoint"),
    ]

    operations: list[migrations.operations.base.Operation] = []
