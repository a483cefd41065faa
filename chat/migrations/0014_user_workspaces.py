from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0013_runningturn_cancel_why"),
    ]

    operations: list[migrations.operations.base.Operation] = []
