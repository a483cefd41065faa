"""`manage.py wipe_history`: delete all chat history, keep everything else.

History is Chunk, QueuedMessage, RunningTurn with its CheckpointPiece rows,
Attachment, Tab and Blob, and the search index over the chunks (chat.search:
tables, not models), and the attachments' files (chat.blobs, removed after the
commit). Everything else stays: the users' workspaces (their files, the copies of
their uploads among them), users, sessions, Setting, ApiKey,
ProviderEndpoint, UsageRecord, Wake and WakeRun (see DETACHED_REFS) and any table
another app adds. The command prints
what it deletes and what it keeps, asks (unless --yes), refuses while a turn runs
(unless --force, which cancels those turns first), deletes in one transaction
with one DELETE per table, then reclaims the space: VACUUM on SQLite, VACUUM
ANALYZE of the emptied tables on PostgreSQL.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Model

from chat import blobs, search, turns
from chat.management.commands.dispatch_status import database_size, human_size
from chat.models import (
    Attachment,
    Blob,
    CheckpointPiece,
    Chunk,
    QueuedMessage,
    RunningTurn,
    Tab,
    Wake,
    WakeRun,
)
from chat.tools import workdir
from chat.turn import lease

# Deletion order: every table before the table its foreign keys point to.
HISTORY_MODELS: tuple[type[Model], ...] = (
    Chunk,
    QueuedMessage,
    CheckpointPiece,
    Attachment,
    RunningTurn,
    Tab,
    Blob,
)

# How long --force waits for cancelled turns to stop. A turn stops at its next
# stream event or tool poll, in well under a few seconds; waiting past
# chat.turn.lease.LEASE_STALE_SECONDS (15 s) also covers a worker that dies
# meanwhile, since its lease then goes stale and is wiped with the rest.
CANCEL_WAIT_SECONDS = 30.0
# Polling the lease rows this often is cheap and keeps the wait short.
CANCEL_POLL_SECONDS = 0.2


# Kept rows that point into the history, which the wipe detaches in its transaction
# instead of refusing. A run keeps its record without its tab. A wake into a tab
# fires into a new tab each time from then on (with the tab's model and profile):
# the user wiped conversations, not their schedules, and a wake that silently stopped
# would be the surprise; its first new tab starts the conversation afresh.
DETACHED_REFS = ("chat.Wake.tab", "chat.WakeRun.tab")


def _detach(using: str) -> int:
    """Detach the kept rows from the history; the number of wakes moved to new tabs."""
    WakeRun.objects.using(using).filter(tab__isnull=False).update(tab=None)
    moved = 0
    for wake in Wake.objects.using(using).filter(tab__isnull=False).select_related("tab"):
        tab = wake.tab
        assert tab is not None  # the filter above
        Wake.objects.using(using).filter(pk=wake.pk).update(
            tab=None,
            new_tab=True,
            model=wake.model or tab.model,
            profile_id=wake.profile_id or tab.profile_id,
        )
        moved += 1
    return moved


def history_tables() -> list[str]:
    return [model._meta.db_table for model in HISTORY_MODELS]


def foreign_history_refs(models: list[type[Model]]) -> list[str]:
    """Foreign keys from tables the wipe keeps into history tables, as "app.Model.field".

    A raw DELETE bypasses Django's on_delete, so such a key would make the
    wipe fail (or leave rows pointing at nothing): the wipe refuses instead.
    """
    history = set(HISTORY_MODELS)
    refs = []
    for model in models:
        if model in history:
            continue
        for field in model._meta.local_fields:
            name = f"{model._meta.label}.{field.name}"
            points_in = field.remote_field is not None and field.remote_field.model in history
            if points_in and name not in DETACHED_REFS:
                refs.append(name)
    return refs


def _kept_models(using: str) -> list[type[Model]]:
    """Every model with a table in this database that is not chat history."""
    existing = set(connections[using].introspection.table_names())
    history = set(history_tables())
    seen: dict[str, type[Model]] = {}
    for model in apps.get_models(include_auto_created=True):
        opts = model._meta
        if opts.proxy or not opts.managed or opts.db_table in history:
            continue
        if opts.db_table in existing:
            seen.setdefault(opts.db_table, model)
    return [seen[table] for table in sorted(seen)]


def _count(using: str, table: str) -> int:
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
        return cursor.fetchone()[0]


def _describe(running: RunningTurn) -> str:
    return f'"{running.tab}" ({running.tab_id})'


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


class Command(BaseCommand):
    help = (
        "Delete all chat history (tabs, chunks, running turns, queued messages, the search "
        "index) and keep "
        "everything else (users, settings, API keys, endpoints, usage)."
    )
    # call_command(..., stdin=...) lets tests answer the question.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--yes",
            "--noinput",
            "--no-input",
            action="store_true",
            dest="yes",
            help="Do not ask for confirmation.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Only print what would be deleted and kept."
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="Cancel running turns and wait for them to stop instead of refusing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = DEFAULT_DB_ALIAS
        self.stdin: TextIO | None = options.get("stdin", sys.stdin)
        kept = _kept_models(using)
        refs = foreign_history_refs(kept)
        if refs:
            raise CommandError(
                f"Kept tables point into the history ({', '.join(refs)}): "
                "add them to HISTORY_MODELS or drop the key; nothing was deleted."
            )

        self.stdout.write("Deletes (chat history):")
        for table in history_tables():
            self.stdout.write(f"  {table}: {_rows(_count(using, table))}")
        self.stdout.write(f"  {search.TABLE} (search index): {_rows(_count(using, search.TABLE))}")
        stored = blobs.Garbage(Blob.objects.count(), blobs.stored_bytes())
        self.stdout.write(f"  attachment files: {stored.count}, {human_size(stored.bytes)}")
        self.stdout.write("Keeps:")
        for model in kept:
            table = model._meta.db_table
            self.stdout.write(f"  {table}: {_rows(_count(using, table))}")
        # The files are the users' own work (their uploads' copies among them), not chat.
        users = Path(settings.DISPATCH_WORKSPACE) / workdir.USERS
        self.stdout.write(f"  the users' workspaces (their files): {users}")

        live: list[RunningTurn] = []
        stale: list[RunningTurn] = []
        for running in RunningTurn.objects.select_related("tab").order_by("started_at"):
            (stale if lease.is_stale(running) else live).append(running)
        if stale:
            names = ", ".join(_describe(r) for r in stale)
            self.stdout.write(f"Stale leases (dead workers), deleted with the history: {names}")
        if live:
            names = ", ".join(_describe(r) for r in live)
            self.stdout.write(f"Turns running on: {names}")

        if options["dry_run"]:
            if live:
                self.stdout.write(
                    "A real run would refuse while these turns run, or cancel them with --force."
                )
            self.stdout.write("Dry run: nothing was deleted.")
            return

        if live and not options["force"]:
            raise CommandError(
                f"{len(live)} turn(s) running on {', '.join(_describe(r) for r in live)}: "
                "wait for them to finish, or use --force to cancel them."
            )
        if not options["yes"]:
            self._confirm()

        if live:
            self._cancel(live)

        size_before = database_size(using)
        started = time.monotonic()
        deleted, indexed, files, moved = self._delete(using)
        # After the commit: a file goes only once no row can point at it.
        for sha256 in files:
            blobs.remove_files(sha256)
        elapsed = time.monotonic() - started
        self.stdout.write(
            f"Deleted {_rows(sum(deleted.values()))} in {elapsed:.1f} s: "
            + ", ".join(f"{table} {n}" for table, n in deleted.items())
            + f"; search index: {_rows(indexed)}; attachment files: {len(files)}"
        )
        if moved:
            self.stdout.write(
                f"{moved} wake(s) that sent to a tab now start a new tab each time they run."
            )
        self._vacuum(using, size_before)

    def _confirm(self) -> None:
        stdin = self.stdin
        isatty = getattr(stdin, "isatty", None)
        if stdin is None or not (isatty and isatty()):
            raise CommandError(
                "No terminal to ask on: rerun with --yes to delete the history without asking."
            )
        self.stdout.write("Delete all chat history above? Type 'yes' to continue: ", ending="")
        self.stdout.flush()
        answer = stdin.readline().strip().lower()
        if answer != "yes":
            raise CommandError("Not confirmed: nothing was deleted.")

    def _cancel(self, live: list[RunningTurn]) -> None:
        tab_ids = [r.tab_id for r in live]
        # A turn that stops with messages queued starts the next turn from
        # them; they are history the user asked to delete, so they go first.
        QueuedMessage.objects.filter(tab_id__in=tab_ids).delete()
        for tab_id in tab_ids:
            turns.cancel(tab_id)
        self.stdout.write(f"Cancelling {len(tab_ids)} turn(s), waiting for them to stop…")
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while True:
            left = [
                r
                for r in RunningTurn.objects.filter(tab_id__in=tab_ids).select_related("tab")
                if not lease.is_stale(r)
            ]
            if not left:
                return
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"Turn(s) on {', '.join(_describe(r) for r in left)} did not stop within "
                    f"{CANCEL_WAIT_SECONDS:g} s; their queued messages were dropped, "
                    "nothing else was deleted."
                )
            time.sleep(CANCEL_POLL_SECONDS)

    def _delete(self, using: str) -> tuple[dict[str, int], int, list[str], int]:
        """One DELETE per history table, children first, and the search index's rows,
        in one transaction. The rows deleted per table, the index's, the blobs whose
        files are to go, and the wakes detached from their tab (_detach).

        Django's delete() would load every row to run its cascade collector,
        which takes minutes on a large log; no signal or on_delete of these
        models needs to run for a wipe of all of them.
        """
        connection = connections[using]
        deleted = {}
        with transaction.atomic(using=using):
            # A turn may have started since the check above; its worker would
            # keep writing into a deleted tab.
            started = [
                r
                for r in RunningTurn.objects.using(using).select_related("tab")
                if not lease.is_stale(r)
            ]
            if started:
                raise CommandError(
                    f"A turn started meanwhile on {', '.join(_describe(r) for r in started)}; "
                    "nothing was deleted."
                )
            files = list(Blob.objects.using(using).values_list("sha256", flat=True))
            moved = _detach(using)
            with connection.cursor() as cursor:
                indexed = search.clear(cursor)
                for table in history_tables():
                    cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
                    deleted[table] = cursor.rowcount
        return deleted, indexed, files, moved

    def _vacuum(self, using: str, size_before: Any) -> None:
        connection = connections[using]
        if connection.in_atomic_block:
            # VACUUM cannot run inside a transaction (a caller's, e.g. a test's).
            self.stdout.write("Skipped VACUUM: the command runs inside a transaction.")
            return
        try:
            with connection.cursor() as cursor:
                if connection.vendor == "sqlite":
                    cursor.execute("VACUUM")
                    # In WAL mode the vacuumed pages sit in the WAL until a
                    # checkpoint copies them back and the file is truncated.
                    cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    done = "VACUUM"
                elif connection.vendor == "postgresql":
                    tables = [*history_tables(), search.TABLE]
                    for table in tables:
                        cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(table)}")
                    done = f"VACUUM ANALYZE {', '.join(tables)}"
                else:
                    self.stdout.write(f"No VACUUM step for {connection.vendor}.")
                    return
        except DatabaseError as exc:
            raise CommandError(
                f"The history is deleted, but reclaiming the space failed ({exc}); "
                "run wipe_history again later to retry."
            ) from exc
        size_after = database_size(using)
        self.stdout.write(
            f"{done}: database {human_size(size_before.size_bytes)} -> "
            f"{human_size(size_after.size_bytes)}"
        )
