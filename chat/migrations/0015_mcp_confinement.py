from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0014_user_workspaces"),
    ]

    operations: list[migrations.operations.base.Operation] = []
