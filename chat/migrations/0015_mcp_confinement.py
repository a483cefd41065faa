from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0014_user_workspaces"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AddField(
            model_name="mcpserver",
            name="mount_workspace",
            field=models.BooleanField(default=False),
        ),
    ]
