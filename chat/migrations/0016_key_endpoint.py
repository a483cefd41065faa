from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0015_mcp_confinement"),
    ]

    operations: list[migrations.operations.base.Operation] = []
