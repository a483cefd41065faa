"""Each user their own workspace: what the one shared workspace held goes to the first
superuser (chat.tools.workdir.adopt_shared). With no user yet, it stays where it is
until `serve`, `runworker` or `send` starts with one (chat.startup)."""

from django.conf import settings
from django.db import migrations

from chat.tools import workdir


def move_shared_workspace(apps, schema_editor):
    owner = workdir.first_owner(apps.get_model(settings.AUTH_USER_MODEL))
    if owner is None:
        return
    try:
        workdir.adopt_shared(owner.pk)
    except (workdir.AdoptionClash, OSError) as exc:
        raise RuntimeError(f"The shared workspace was not moved: {exc}") from exc


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0013_runningturn_cancel_why"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(move_shared_workspace, migrations.RunPython.noop, elidable=True),
    ]
