"""Each user their own workspace: what the one shared workspace held goes to the first
superuser (chat.tools.workdir.adopt_shared). With no user yet, it stays where it is
until `serve`, `runworker` or `send` starts with one (chat.startup)."""

from django.conf import settings
from django.db import migrations

from chat.tools import workdir

RAN_KEY = "workspaces_per_user"


def move_shared_workspace(apps, schema_editor):
    owner = workdir.first_owner(apps.get_model(settings.AUTH_USER_MODEL))
    setting = apps.get_model("chat", "Setting")
    # The first time, no `users` folder is ours, whatever it holds (every user's tools
    # could write one, marker and all, into the shared workspace); once this has run
    # (migrated back and forth), the folder with the marker is the users' workspaces.
    ran = setting.objects.filter(key=RAN_KEY).exists()
    try:
        workdir.adopt_shared(owner and owner.pk, trust_marker=ran)
    except (workdir.AdoptionClash, OSError) as exc:
        raise RuntimeError(f"The shared workspace was not moved: {exc}") from exc
    setting.objects.update_or_create(key=RAN_KEY, defaults={"value": True})


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0013_runningturn_cancel_why"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(move_shared_workspace, migrations.RunPython.noop, elidable=True),
    ]
