"""Each user their own workspace: what the one shared workspace held goes to the first
superuser (chat.tools.workdir.adopt_shared). With no user yet, it stays where it is
until `serve`, `runworker` or `send` starts with one (chat.startup)."""

from django.conf import settings
from django.db import migrations

from chat.tools import workdir


def move_shared_workspace(apps, schema_editor):
    owner = workdir.first_owner(apps.get_model(settings.AUTH_USER_MODEL))
    try:
        # No `users` folder is taken for the users' workspaces here, whatever it holds:
        # the code before this migration let every user's tools write one, marker and
        # all (also after migrating back to it, so moving forward again merges them all
        # into the first superuser's, as the README says).
        workdir.adopt_shared(owner and owner.pk, trust_marker=False)
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
