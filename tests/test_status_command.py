"""`manage.py dispatch_status`: counts, database size, running turns and queued messages."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from chat.management.commands.dispatch_status import human_size
from chat.tools import sandbox
from tests import opsdata

pytestmark = pytest.mark.django_db


def _status(*args: str) -> str:
    out = io.StringIO()
    call_command("dispatch_status", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def busy():
    """Three tabs: one with a live turn, one with a stale lease and two queued messages."""
    owner = User.objects.create_user("alice", "alice@example.com", "pw-alice-123")
    tabs = opsdata.fill_history(owner, tabs=3)
    live = opsdata.start_turn(tabs[0])
    stale = opsdata.start_turn(tabs[1], stale=True)
    opsdata.queue(tabs[1], "First", "Second")
    return {"tabs": tabs, "live": live, "stale": stale}


def test_it_reports_counts_size_turns_and_queue(busy):
    """The text report has the counts, the size, each running turn and each tab's queue."""
    output = _status()
    lines = output.splitlines()

    assert lines[0].startswith("Database: ")
    assert not lines[0].endswith("unknown")
    assert "Tabs: 3" in lines
    assert "Chunks: 24" in lines
    assert "Running turns: 2" in lines
    assert "Queued messages: 2" in lines
    live_line = next(line for line in lines if str(busy["live"].tab_id) in line)
    stale_line = next(
        line for line in lines if str(busy["stale"].tab_id) in line and "turn " in line
    )
    assert "History tab 0" in live_line and "running at step 2" in live_line
    assert "lease age" in live_line and "STALE" not in live_line
    assert "[STALE]" in stale_line
    assert f"turn {str(busy['stale'].turn_id)[:8]}" in stale_line
    queue_line = next(
        line for line in lines if line.startswith("  History tab 1") and ": 2," in line
    )
    assert "oldest" in queue_line


def test_it_reports_the_same_facts_as_json(busy):
    """--json gives one object with lease ages and stale flags per running turn."""
    facts = json.loads(_status("--json"))

    assert (facts["tabs"], facts["chunks"]) == (3, 24)
    assert facts["database"]["size_bytes"] > 0
    by_tab = {turn["tab_id"]: turn for turn in facts["running_turns"]}
    live = by_tab[str(busy["live"].tab_id)]
    stale = by_tab[str(busy["stale"].tab_id)]
    assert live["stale"] is False and stale["stale"] is True
    assert 0 <= live["lease_age_seconds"] < stale["lease_age_seconds"]
    assert stale["lease_age_seconds"] >= 600 - 1
    assert live["open_chunk"] is True
    assert facts["queued_messages"] == [
        {
            "tab_id": str(busy["tabs"][1].pk),
            "tab": "History tab 1",
            "count": 2,
            "oldest_at": facts["queued_messages"][0]["oldest_at"],
        }
    ]


def test_it_marks_a_cancel_that_was_requested(busy):
    """A turn asked to stop says so until its worker lets go."""
    busy["live"].cancel_requested = True
    busy["live"].save(update_fields=["cancel_requested"])

    output = _status()

    assert "[cancel requested]" in output


def test_it_reports_an_empty_database():
    """With no history the report still prints every line, with zeros."""
    lines = _status().splitlines()

    assert lines[1:] == [
        "Tabs: 0",
        "Chunks: 0",
        "Running turns: 0",
        "Queued messages: 0",
        "Shell: sandboxed, network on",
    ]


def test_it_reports_a_shell_without_network(settings):
    settings.DISPATCH_SHELL_NETWORK = False
    assert _status().splitlines()[-1] == "Shell: sandboxed, network off"
    assert json.loads(_status("--json"))["shell"]["network"] is False


def test_it_reports_why_the_shell_is_unavailable(monkeypatch, tmp_path):
    """Where bwrap cannot run, the report says so with the reason and the fix."""
    missing = str(tmp_path / "no-bwrap")
    monkeypatch.setattr(sandbox, "BWRAP", missing)
    lines = _status().splitlines()
    assert lines[-2] == "Shell: unavailable, network on"
    assert lines[-1] == "  " + sandbox.check(sandbox.Policy(bwrap=missing)).problem
    assert "apt-get install bubblewrap" in lines[-1]
    shell = json.loads(_status("--json"))["shell"]
    assert shell["state"] == "unavailable" and shell["detail"] == lines[-1].strip()


def test_it_reports_the_opt_out(settings):
    """DISPATCH_SHELL_UNSANDBOXED=1 is shown, with what it exposes."""
    settings.DISPATCH_SHELL_UNSANDBOXED = True
    lines = _status().splitlines()
    assert lines[-2] == "Shell: unsandboxed, network on"
    assert lines[-1].startswith("  DISPATCH_SHELL_UNSANDBOXED is set: shell commands run without")


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "unknown"), (0, "0 B"), (1023, "1023 B"), (2048, "2.0 KB"), (5 * 1024**3, "5.0 GB")],
)
def test_it_prints_sizes_for_people(size, text):
    """Sizes are shown in the largest unit under 1024, up to GB."""
    assert human_size(size) == text
