"""`manage.py wipe_history`: history goes, every other row stays exactly as it was.

DB-agnostic: run once more against PostgreSQL with
DATABASE_URL=postgres://postgres@127.0.0.1:5432/dispatch_test_ops.
The tests are transactional because VACUUM cannot run inside a transaction
and the --force test has a second thread with its own connection.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, models
from django.test.utils import isolate_apps
from django.utils import timezone

from chat import log
from chat.management.commands import wipe_history
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from tests import opsdata

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
HISTORY_LABELS = [
    "chat.chunk",
    "chat.tab",
    "chat.runningturn",
    "chat.checkpointpiece",
    "chat.queuedmessage",
]
# A subprocess imports Django and the app: a few seconds on a slow machine.
SUBPROCESS_TIMEOUT = 60
# How long the simulated worker keeps its lease alive waiting for a cancel;
# far past anything the command needs, short enough not to hang a failing run.
HOLDER_TIMEOUT = 20.0
# Enough chunk payload (a few MB) that the file shrinking is not noise.
BULKY_CHUNKS = 2_000
BULKY_TEXT = "x" * 2_000


class _Terminal(io.StringIO):
    """A stdin that says it is a terminal, with the answer already typed."""

    def isatty(self) -> bool:
        return True


def _dump(*, exclude: list[str]) -> str:
    out = io.StringIO()
    call_command("dumpdata", exclude=exclude, indent=1, stdout=out)
    return out.getvalue()


def _wipe(*args: str, **options) -> str:
    out = io.StringIO()
    call_command("wipe_history", *args, stdout=out, **options)
    return out.getvalue()


@pytest.fixture
def filled():
    """Tabs with chunks of every type, a checkpointed (stale) turn, queued messages, kept state."""
    kept = opsdata.fill_kept_state()
    tabs = opsdata.fill_history(kept["user"], tabs=3)
    opsdata.start_turn(tabs[0], stale=True)
    opsdata.queue(tabs[1], "And then?", "Also this.")
    assert set(Chunk.objects.values_list("type", flat=True)) == {
        "text",
        "thinking",
        "tool_call",
        "tool_result",
        "error",
        "system",
    }
    assert set(Chunk.objects.values_list("role", flat=True)) == {
        "user",
        "assistant",
        "tool",
        "system",
    }
    assert RunningTurn.objects.get().pieces.exists()
    return {"tabs": tabs, **kept}


def test_it_deletes_the_history_and_keeps_every_other_row(filled):
    """After --yes the history tables are empty and the kept tables dump identically."""
    kept_before = _dump(exclude=HISTORY_LABELS)

    output = _wipe(yes=True)

    assert opsdata.history_counts() == {
        "chunks": 0,
        "tabs": 0,
        "running": 0,
        "pieces": 0,
        "queued": 0,
    }
    assert _dump(exclude=HISTORY_LABELS) == kept_before
    for label in [
        "auth.user",
        "sessions.session",
        "chat.setting",
        "chat.apikey",
        "chat.providerendpoint",
        "chat.usagerecord",
        "admin.logentry",
        "auth.group",
    ]:
        assert f'"model": "{label}"' in kept_before, label
    assert "chat_chunk: 24 rows" in output
    assert "chat_tab: 3 rows" in output
    assert "chat_runningturn: 1 row" in output
    assert "chat_checkpointpiece: 1 row" in output
    assert "chat_queuedmessage: 2 rows" in output
    assert "auth_user: 2 rows" in output
    assert "chat_apikey: 1 row" in output
    assert "chat_usagerecord: 7 rows" in output
    assert "Deleted 31 rows" in output


def test_it_lists_what_it_keeps_before_what_it_does(filled):
    """The plan names the deleted tables under "Deletes" and the kept ones under "Keeps"."""
    output = _wipe(yes=True)

    deletes, keeps = output.split("Deletes (chat history):")[1].split("Keeps:")
    for table in [
        "chat_chunk",
        "chat_tab",
        "chat_runningturn",
        "chat_checkpointpiece",
        "chat_queuedmessage",
    ]:
        assert table in deletes and table not in keeps.split("Deleted")[0]
    for table in [
        "auth_user",
        "django_session",
        "chat_setting",
        "chat_apikey",
        "chat_providerendpoint",
        "chat_usagerecord",
        "auth_user_groups",
    ]:
        assert f"  {table}:" in keeps


def test_it_changes_nothing_on_a_dry_run(filled):
    """--dry-run prints the plan and leaves every table, history included, as it was."""
    everything_before = _dump(exclude=[])

    output = _wipe(dry_run=True)

    assert _dump(exclude=[]) == everything_before
    assert "chat_chunk: 24 rows" in output
    assert output.rstrip().endswith("Dry run: nothing was deleted.")


def test_it_says_on_a_dry_run_that_a_running_turn_would_block(filled):
    """A dry run with a live turn names it, says a real run would refuse, and still succeeds."""
    opsdata.start_turn(filled["tabs"][2])
    before = opsdata.history_counts()

    output = _wipe(dry_run=True)

    assert 'Turns running on: "History tab 2"' in output
    assert "A real run would refuse while these turns run" in output
    assert opsdata.history_counts() == before
    assert not RunningTurn.objects.filter(cancel_requested=True).exists()


def test_it_refuses_without_a_terminal_to_ask_on(filled):
    """Without --yes and with stdin not a terminal it refuses and deletes nothing."""
    before = opsdata.history_counts()

    with pytest.raises(CommandError, match="No terminal to ask on: rerun with --yes"):
        _wipe(stdin=io.StringIO("yes\n"))

    assert opsdata.history_counts() == before


def test_it_wipes_when_the_operator_types_yes(filled):
    """On a terminal, typing "yes" confirms."""
    output = _wipe(stdin=_Terminal("yes\n"))

    assert "Type 'yes' to continue" in output
    assert opsdata.history_counts()["chunks"] == 0


@pytest.mark.parametrize("answer", ["no\n", "y\n", ""])
def test_it_deletes_nothing_unless_the_answer_is_yes(filled, answer):
    """Any other answer, or end of input, cancels with an error and deletes nothing."""
    before = opsdata.history_counts()

    with pytest.raises(CommandError, match="Not confirmed: nothing was deleted."):
        _wipe(stdin=_Terminal(answer))

    assert opsdata.history_counts() == before


def test_it_refuses_while_a_turn_is_running(filled):
    """A RunningTurn with a fresh heartbeat blocks the wipe, and the error names its tab."""
    live_tab = filled["tabs"][2]
    opsdata.start_turn(live_tab)
    before = opsdata.history_counts()

    with pytest.raises(CommandError) as refused:
        _wipe(yes=True)

    message = str(refused.value)
    assert "1 turn(s) running on" in message
    assert f'"History tab 2" ({live_tab.pk})' in message
    assert "--force" in message
    assert "\n" not in message
    assert opsdata.history_counts() == before
    assert not RunningTurn.objects.get(pk=live_tab.pk).cancel_requested


def test_it_deletes_a_stale_lease_with_the_history(filled):
    """A lease whose worker is gone does not block the wipe; it is deleted like the rest."""
    output = _wipe(yes=True)

    assert '"History tab 0"' in output.split("Stale leases")[1].splitlines()[0]
    assert not RunningTurn.objects.exists()


def test_it_cancels_running_turns_with_force(filled):
    """--force cancels each running turn, waits for its holder to let go, then wipes."""
    live_tab = filled["tabs"][2]
    opsdata.start_turn(live_tab)
    holder = _Holder(live_tab.pk)
    holder.start()
    try:
        output = _wipe(yes=True, force=True)
    finally:
        holder.join(HOLDER_TIMEOUT)

    assert holder.saw_cancel
    assert "Cancelling 1 turn(s)" in output
    assert opsdata.history_counts() == {
        "chunks": 0,
        "tabs": 0,
        "running": 0,
        "pieces": 0,
        "queued": 0,
    }


def test_it_gives_up_when_a_cancelled_turn_does_not_stop(filled, monkeypatch):
    """If a cancelled turn keeps its lease past the bound, the wipe stops with an error."""
    monkeypatch.setattr(wipe_history, "CANCEL_WAIT_SECONDS", 0.5)
    live_tab = filled["tabs"][1]
    opsdata.start_turn(live_tab)

    with pytest.raises(CommandError, match="did not stop within 0.5 s"):
        _wipe(yes=True, force=True)

    assert RunningTurn.objects.get(pk=live_tab.pk).cancel_requested
    assert Chunk.objects.count() == 24
    # Dropped first, so the cancelled turn does not start the next one from them.
    assert not QueuedMessage.objects.filter(tab=live_tab).exists()


def test_it_refuses_when_a_kept_table_points_into_the_history():
    """A kept model with a foreign key to Tab would break the raw DELETE: it is named."""
    with isolate_apps("chat"):

        class Reminder(models.Model):
            tab = models.ForeignKey(Tab, on_delete=models.CASCADE)

            class Meta:
                app_label = "chat"

        refs = wipe_history.foreign_history_refs([Reminder, Chunk, QueuedMessage])

    assert refs == ["chat.Reminder.tab"]


def test_it_shrinks_the_database_file(filled):
    """After the wipe, VACUUM gives the space back: the file (with its WAL) is smaller."""
    tab = filled["tabs"][1]
    turn_id = uuid.uuid4()
    log.append(
        tab.pk,
        [
            opsdata.block(turn_id, 0, "assistant", "text", {"text": f"{n} {BULKY_TEXT}"})
            for n in range(BULKY_CHUNKS)
        ],
    )
    size_before = _db_size()

    output = _wipe(yes=True)

    if connection.vendor == "sqlite":
        assert _db_size() < size_before / 2
        assert "VACUUM: database" in output
    else:
        # Every table the wipe emptied, and the search index.
        vacuumed = next(line for line in output.splitlines() if "VACUUM ANALYZE " in line)
        for table in [*wipe_history.history_tables(), "chat_searchentry"]:
            assert table in vacuumed
    assert opsdata.history_counts()["chunks"] == 0


def test_it_exits_non_zero_with_a_one_line_reason(filled):
    """Run as a process without a terminal and without --yes: exit status 1, one line why."""
    before = opsdata.history_counts()

    result = subprocess.run(
        [sys.executable, "manage.py", "wipe_history"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": _database_url(), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "CommandError: No terminal to ask on: rerun with --yes to delete the history "
        "without asking."
    ]
    assert "chat_chunk: 24 rows" in result.stdout
    assert opsdata.history_counts() == before


def test_it_exits_zero_when_the_wipe_succeeds(filled):
    """The same process with --yes deletes the history and exits 0."""
    result = subprocess.run(
        [sys.executable, "manage.py", "wipe_history", "--noinput"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": _database_url()},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )

    assert result.returncode == 0, result.stderr
    assert opsdata.history_counts()["chunks"] == 0


class _Holder(threading.Thread):
    """Stands in for the worker holding a tab's lease: heartbeats until asked to cancel.

    On cancel_requested it deletes its RunningTurn row, as the real worker does
    once its turn has stopped.
    """

    def __init__(self, tab_id: uuid.UUID) -> None:
        super().__init__(daemon=True)
        self.tab_id = tab_id
        self.saw_cancel = False

    def run(self) -> None:
        try:
            deadline = time.monotonic() + HOLDER_TIMEOUT
            while time.monotonic() < deadline:
                row = RunningTurn.objects.filter(tab_id=self.tab_id)
                if row.filter(cancel_requested=True).exists():
                    self.saw_cancel = True
                    row.delete()
                    return
                row.update(heartbeat_at=timezone.now())
                time.sleep(0.05)
        finally:
            connection.close()


def _db_size() -> int:
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        return sum(os.path.getsize(p) for p in (name, f"{name}-wal") if os.path.exists(p))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def _database_url() -> str:
    """A DATABASE_URL for the test database this test runs on, for a subprocess."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = quote(settings["USER"] or "")
    password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    host = settings["HOST"] or "127.0.0.1"
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/{settings['NAME']}"
