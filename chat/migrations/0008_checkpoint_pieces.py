import django.db.models.deletion
from django.db import migrations, models


def _body_key(kind):
    # chat.stream's rule, as of this migration.
    return "shell_output" if kind == "tool_result" else "text"


def split_bodies(apps, schema_editor):
    """A checkpoint written before pieces held the whole block: its body becomes one piece."""
    RunningTurn = apps.get_model("chat", "RunningTurn")
    CheckpointPiece = apps.get_model("chat", "CheckpointPiece")
    for running in RunningTurn.objects.filter(open_header__isnull=False):
        header = running.open_header
        body = header["data"].pop(_body_key(header["type"]), "")
        running.save(update_fields=["open_header"])
        if body:
            CheckpointPiece.objects.create(
                running=running, chunk_id=header["id"], offset=0, text=body
            )


def join_bodies(apps, schema_editor):
    RunningTurn = apps.get_model("chat", "RunningTurn")
    for running in RunningTurn.objects.filter(open_header__isnull=False):
        header = running.open_header
        pieces = running.pieces.filter(chunk_id=header["id"]).order_by("offset")
        header["data"][_body_key(header["type"])] = "".join(p.text for p in pieces)
        running.save(update_fields=["open_header"])


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0007_context"),
    ]

    operations = [
        migrations.RenameField(
            model_name="runningturn",
            old_name="open_chunk",
            new_name="open_header",
        ),
        migrations.CreateModel(
            name="CheckpointPiece",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("chunk_id", models.UUIDField()),
                ("offset", models.PositiveIntegerField()),
                ("text", models.TextField()),
                (
                    "running",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="pieces",
                        to="chat.runningturn",
                    ),
                ),
            ],
        ),
        migrations.RunPython(split_bodies, join_bodies),
    ]
