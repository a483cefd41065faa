"""`manage.py send --continue --tab <id>`: the tab's last turn, cut short, goes on.

Subprocesses on the test database where the exit status or another process's
lease matters, as in tests/test_send.py; call_command for the argument checks.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from chat import log, resume
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.stream import Block
from chat.turn import lease
from tests.test_send import last_line, send, unowned

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workspace(tmp_path, settings):
    settings.DISPATCH_WORKSPACE = tmp_path
    return tmp_path


@pytest.fixture
def tab(db) -> Tab:
    return Tab.objects.create(title="story", model="offline/demo")


def cut_short(tab: Tab, kind: str, text: str = "Once upon a time") -> list[Chunk]:
    """A turn on `tab` that stopped while writing `text`; its chunks."""
    turn = uuid.uuid4()
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "write a story"}),
            Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": text}),
            Block(uuid.uuid4(), turn, 1, "system", "system", {"kind": kind, "text": "cut"}),
        ],
    )
    return list(Chunk.objects.filter(tab=tab, turn_id=turn).order_by("seq"))


def finished(tab: Tab) -> None:
    turn = uuid.uuid4()
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "hi"}),
            Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": "hello"}),
        ],
    )


def chunks_of(tab: Tab) -> list[tuple]:
    return list(Chunk.objects.filter(tab=tab).order_by("seq").values_list("seq", "type", "data"))


def test_it_continues_a_turn_a_killed_send_left_running(workspace, tab):
    """A lease whose worker died mid-text: recovered (the text kept, marked interrupted,
    and a notice), then a new turn says what was cut, and the model answers it."""
    turn = uuid.uuid4()
    log.append(tab.id, [Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "tell a story"})])
    open_text = Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": "Once upon a time"})
    RunningTurn.objects.create(
        tab=tab,
        turn_id=turn,
        worker="another-host:4242:gone",
        heartbeat_at=timezone.now() - timedelta(hours=1),
        step=1,
    )
    log.checkpoint(tab.pk, open_text, None)
    # checkpoint() refreshes the heartbeat, as a live worker's does: its worker died since.
    RunningTurn.objects.update(heartbeat_at=timezone.now() - timedelta(hours=1))
    done = send(workspace, "--continue", "--tab", str(tab.pk))
    assert done.returncode == 0, done.stderr
    rows = list(Chunk.objects.filter(tab=tab).order_by("seq"))
    assert rows[1].data == {"text": "Once upon a time", "interrupted": True}
    assert rows[2].data["kind"] == "interrupted"
    message = rows[3]
    assert (message.role, message.type) == ("user", "text")
    assert message.turn_id != turn
    assert message.data["text"] == resume.message(rows[:3])
    assert "Once upon a time" in message.data["text"]
    shown = "".join(f"> {line}\n" for line in message.data["text"].splitlines())
    assert done.stdout.startswith(shown)
    assert rows[-1].role == "assistant" and rows[-1].turn_id == message.turn_id
    assert not RunningTurn.objects.exists() and not QueuedMessage.objects.exists()


def test_it_passes_yes_to_tools_on_to_the_continued_turn(workspace, tab):
    """The continued turn runs its tools unasked with --yes-to-tools (the offline model
    takes the backticked command quoted in the message as one to run)."""
    cut_short(tab, "output-limit", "Next I will run `touch made.txt`")
    done = send(workspace, "--continue", "--tab", str(tab.pk), "--yes-to-tools")
    assert done.returncode == 0, done.stderr
    assert "needs approval" not in done.stderr
    assert (unowned(workspace) / "made.txt").exists()


def test_nothing_to_continue_exits_1_and_changes_nothing(workspace, tab):
    finished(tab)
    before = chunks_of(tab)
    done = send(workspace, "--continue", "--tab", str(tab.pk))
    assert done.returncode == 1
    assert last_line(done.stderr) == f"CommandError: {resume.NOTHING}"
    assert chunks_of(tab) == before
    assert not QueuedMessage.objects.exists()


def test_a_running_turn_is_not_continued(workspace, tab):
    """A lease whose worker is alive (pid 1 on this host, a fresh heartbeat) is left
    alone: nothing is recovered or queued."""
    cut_short(tab, "output-limit")
    before = chunks_of(tab)
    running = RunningTurn.objects.create(
        tab=tab,
        turn_id=uuid.uuid4(),
        worker=f"{lease.HOST_ID}:1:alive",
        heartbeat_at=timezone.now(),
    )
    done = send(workspace, "--continue", "--tab", str(tab.pk))
    assert done.returncode == 1
    assert last_line(done.stderr) == (
        "CommandError: A turn is running: wait for it to end, or stop it, first."
    )
    assert chunks_of(tab) == before
    assert list(RunningTurn.objects.all()) == [running]
    assert not QueuedMessage.objects.exists()


def run(*args: str) -> str:
    """call_command's CommandError message for `send` with these arguments."""
    with pytest.raises(CommandError) as raised:
        call_command("send", *args, stdout=io.StringIO(), stderr=io.StringIO())
    return str(raised.value)


def test_an_empty_tab_has_nothing_to_continue(workspace, tab):
    assert run("--continue", "--tab", str(tab.pk)) == resume.EMPTY
    assert not Chunk.objects.exists() and not QueuedMessage.objects.exists()


@pytest.mark.parametrize("tab_id", ["not-a-uuid", "8d1f3c0e-0000-4000-8000-000000000000"])
def test_continue_of_a_tab_that_does_not_exist(workspace, tab_id):
    assert run("--continue", "--tab", tab_id) == f"no tab with id {tab_id!r}"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--continue", "--new"], "--continue needs --tab <id>: a new tab has nothing to continue"),
        (
            ["--continue", "--tab", "{tab}", "go on"],
            "--continue sends its own message (what was cut short and where): "
            "leave the message out",
        ),
        (
            ["--continue", "--tab", "{tab}", "--model", "offline/demo"],
            "--continue keeps the tab's model: leave --model out",
        ),
        (["--tab", "{tab}"], "a message is required (or --continue --tab <id>)"),
    ],
)
def test_it_refuses_arguments_that_do_not_go_together(workspace, tab, args, message):
    cut_short(tab, "output-limit")
    before = chunks_of(tab)
    assert run(*[a.format(tab=tab.pk) for a in args]) == message
    assert list(Tab.objects.all()) == [tab]
    assert chunks_of(tab) == before
    assert not QueuedMessage.objects.exists()
