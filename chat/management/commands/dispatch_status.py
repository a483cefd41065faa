"""`manage.py dispatch_status`: what the database holds, which turns are running, and
what the shell tool runs in (its sandbox, or why there is none).

Read-only. `--json` prints the same facts as one JSON object, for scripts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.sqlite3.creation import DatabaseCreation as SQLiteCreation
from django.db.models import Count, Min
from django.utils import timezone

from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.tools import sandbox
from chat.turn.lease import is_stale


@dataclass(frozen=True)
class DatabaseSize:
    vendor: str
    name: str
    # None when the database has no size to report (SQLite in memory, other vendors).
    size_bytes: int | None


def database_size(using: str = DEFAULT_DB_ALIAS) -> DatabaseSize:
    """The database's size on disk: SQLite's file plus its WAL, PostgreSQL's pg_database_size."""
    connection = connections[using]
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        if SQLiteCreation.is_in_memory_db(name):
            return DatabaseSize("sqlite", name, None)
        size = sum(os.path.getsize(path) for path in (name, f"{name}-wal") if os.path.exists(path))
        return DatabaseSize("sqlite", name, size)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_database_size(current_database())")
            (size,) = cursor.fetchone()
        return DatabaseSize("postgresql", name, size)
    return DatabaseSize(connection.vendor, name, None)


def human_size(size: int | None) -> str:
    if size is None:
        return "unknown"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def status() -> dict[str, Any]:
    """The facts the command prints, as plain data."""
    now = timezone.now()
    size = database_size()
    running = []
    for turn in RunningTurn.objects.select_related("tab").order_by("started_at"):
        running.append(
            {
                "tab_id": str(turn.tab_id),
                "tab": str(turn.tab),
                "turn_id": str(turn.turn_id),
                "worker": turn.worker,
                "status": turn.status,
                "step": turn.step,
                "started_at": turn.started_at.isoformat(),
                "lease_age_seconds": round((now - turn.heartbeat_at).total_seconds(), 1),
                "stale": is_stale(turn),
                "cancel_requested": turn.cancel_requested,
                "open_chunk": turn.open_header is not None,
            }
        )
    queued = [
        {
            "tab_id": str(row["tab_id"]),
            "tab": row["title"] or f"Tab {str(row['tab_id'])[:8]}",
            "count": row["count"],
            "oldest_at": row["oldest"].isoformat(),
        }
        for row in QueuedMessage.objects.values("tab_id")
        .annotate(title=Min("tab__title"), count=Count("id"), oldest=Min("created_at"))
        .order_by("oldest")
    ]
    shell = sandbox.state(sandbox.policy_from(settings))
    return {
        "database": {"vendor": size.vendor, "name": size.name, "size_bytes": size.size_bytes},
        "tabs": Tab.objects.count(),
        "chunks": Chunk.objects.count(),
        "running_turns": running,
        "queued_messages": queued,
        "shell": {"state": shell.state, "network": shell.network, "detail": shell.detail},
    }


class Command(BaseCommand):
    help = (
        "Show tabs, chunks, database size, running turns (lease age, stale), queued messages "
        "and the shell's sandbox."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        facts = status()
        if options["json"]:
            self.stdout.write(json.dumps(facts, indent=2))
            return
        db = facts["database"]
        self.stdout.write(f"Database: {db['vendor']} {db['name']}, {human_size(db['size_bytes'])}")
        self.stdout.write(f"Tabs: {facts['tabs']}")
        self.stdout.write(f"Chunks: {facts['chunks']}")
        self.stdout.write(f"Running turns: {len(facts['running_turns'])}")
        for turn in facts["running_turns"]:
            flags = []
            if turn["stale"]:
                flags.append("STALE")
            if turn["cancel_requested"]:
                flags.append("cancel requested")
            self.stdout.write(
                f"  {turn['tab']} ({turn['tab_id']}): turn {turn['turn_id'][:8]} {turn['status']}"
                f" at step {turn['step']} on {turn['worker']},"
                f" lease age {turn['lease_age_seconds']:.1f} s"
                + (f" [{', '.join(flags)}]" if flags else "")
            )
        total = sum(row["count"] for row in facts["queued_messages"])
        self.stdout.write(f"Queued messages: {total}")
        for row in facts["queued_messages"]:
            self.stdout.write(
                f"  {row['tab']} ({row['tab_id']}): {row['count']}, oldest {row['oldest_at']}"
            )
        shell = facts["shell"]
        network = "on" if shell["network"] else "off"
        self.stdout.write(f"Shell: {shell['state']}, network {network}")
        if shell["state"] != "sandboxed":
            self.stdout.write(f"  {shell['detail']}")
