from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0016_key_endpoint"),
    ]

    operations = [
        migrations.AddField(
            model_name="tab",
            name="profile_by_model",
            field=models.BooleanField(default=False),
        ),
    ]
