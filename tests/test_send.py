"""`manage.py send` as a user runs it: a real subprocess on the test database."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.core.management.base import OutputWrapper
from django.db import connection

from chat import log, worker
from chat.management.commands.send import TextPrinter
from chat.models import CheckpointPiece, Chunk, RunningTurn, Tab
from chat.preferences import new_tab
from chat.providers.base import TextDelta
from chat.providers.offline import TOKEN_RE
from chat.stream import Block
from chat.tools.workdir import user_workspace_under
from chat.turn import lease, step

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
# A send of the offline model at full speed takes well under this.
SEND_TIMEOUT = 60


def send_env(workspace: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatch.settings",
        "DISPATCH_DATA_DIR": str(settings.DATA_DIR),
        "DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}",
        "DISPATCH_WORKSPACE": str(workspace),
        "DISPATCH_OFFLINE_PACE": "0",
        "DISPATCH_MODEL": "offline/demo",
        "LOG_LEVEL": "WARNING",
    }
    env.pop("REDIS_URL", None)
    env.update(extra)
    return env


def send(workspace: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "send", *args],
        cwd=ROOT,
        env=send_env(workspace, **env),
        capture_output=True,
        text=True,
        timeout=SEND_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def unowned(top: Path) -> Path:
    """Where the tabs of `send --new` work with no superuser (so no owner) to give them."""
    return user_workspace_under(top, None)


@pytest.fixture
def workspace(tmp_path):
    """The sends' DISPATCH_WORKSPACE."""
    (unowned(tmp_path) / "notes.txt").write_text("some notes\n")
    return tmp_path


def test_it_runs_a_turn_with_a_tool_and_prints_it(workspace):
    done = send(workspace, "--new", "list the files")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "[thinking] " in out
    assert '→ list_files {"path": "."}' in out
    assert "← list_files:" in out and "notes.txt" in out
    tab = Tab.objects.get()
    kinds = [f"{c.role}/{c.type}" for c in log.tail(tab.pk)]
    assert kinds == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/thinking",
        "assistant/text",
    ]
    assert not RunningTurn.objects.exists()


def test_json_prints_one_op_per_line_and_continues_a_tab(workspace):
    first = send(workspace, "--new", "hello")
    assert first.returncode == 0, first.stderr
    tab = Tab.objects.get()
    done = send(workspace, "--tab", str(tab.pk), "--json", "hello again")
    assert done.returncode == 0, done.stderr
    ops = [json.loads(line) for line in done.stdout.splitlines()]
    assert {op["op"] for op in ops} >= {"taken", "open", "delta", "seal", "status"}
    assert ops[-1] == {"op": "status", "status": ops[-1]["status"]}
    assert ops[-1]["status"]["state"] == "idle"
    sealed = [op["block"] for op in ops if op["op"] == "seal"]
    assert [b["seq"] for b in sealed] == [
        c.seq for c in log.tail(tab.pk, after=sealed[0]["seq"] - 1)
    ]


def test_tools_are_denied_without_a_terminal_unless_told_yes(workspace):
    denied = send(workspace, "--new", "run `touch made.txt`")
    assert denied.returncode == 0
    assert "needs approval; denied (no terminal)" in denied.stderr
    assert not (unowned(workspace) / "made.txt").exists()
    allowed = send(workspace, "--new", "--yes-to-tools", "run `touch made.txt`")
    assert allowed.returncode == 0, allowed.stderr
    assert (unowned(workspace) / "made.txt").exists()


def test_bad_input_gets_a_clear_error(workspace):
    missing = send(workspace, "--tab", "not-a-uuid", "hi")
    assert missing.returncode != 0 and "no tab with id 'not-a-uuid'" in missing.stderr
    empty = send(workspace, "--new", "   ")
    assert empty.returncode != 0 and "The message is empty." in empty.stderr
    unknown = send(workspace, "--new", "--model", "nowhere/model", "hi")
    assert unknown.returncode != 0
    assert "error" in unknown.stderr.lower()
    error = Chunk.objects.filter(type="error").get()
    assert "nowhere" in error.data["message"]


class Reader(threading.Thread):
    """Collects a subprocess's stdout as it comes."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.text = stream, ""

    def run(self) -> None:
        while chunk := self.stream.read(1):
            self.text += chunk


# Pace of the killed turn: slow enough to kill it mid-text.
CRASH_PACE = 20.0


def test_a_killed_runner_loses_at_most_about_a_second_and_is_recovered(workspace):
    """SIGKILL mid-text, its checkpoint in several pieces: the pieces hold all but ~1 s of
    the text; recovery seals exactly that and says so."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "send", "--new", "tell me a story"],
        cwd=ROOT,
        env=send_env(workspace, DISPATCH_OFFLINE_PACE=str(CRASH_PACE)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    reader = Reader(proc.stdout)
    reader.start()
    try:
        deadline = time.monotonic() + SEND_TIMEOUT
        while time.monotonic() < deadline:
            running = RunningTurn.objects.first()
            cp = log.checkpointed(running.tab_id) if running else None
            if (
                cp
                and cp.type == "text"
                and len(TOKEN_RE.findall(cp.text)) >= 10
                and CheckpointPiece.objects.filter(chunk_id=cp.id).count() >= 2
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the text block was never checkpointed")
        time.sleep(0.6)  # mid-way between checkpoints
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=5)
    running = RunningTurn.objects.get()
    saved = log.checkpointed(running.tab_id).text
    # What the terminal showed of the text block, from its first characters on.
    printed = reader.text[reader.text.index(saved[:20]) :]
    assert printed.startswith(saved)
    lost_tokens = len(TOKEN_RE.findall(printed[len(saved) :]))
    # At most CHECKPOINT_MAX (1 s) of tokens, with a little slack for scheduling.
    assert lost_tokens <= CRASH_PACE * 1.5

    # The pid is gone: recovery does not wait for the lease to go stale.
    assert lease.recover_stale() == [running.tab_id]
    rows = log.tail(running.tab_id)
    assert rows[-2].type == "text" and rows[-2].data == {"text": saved, "interrupted": True}
    assert rows[-1].data["kind"] == "interrupted"
    assert not RunningTurn.objects.exists() and not CheckpointPiece.objects.exists()

    # The tab works afterwards.
    again = send(workspace, "--tab", str(running.tab_id), "hello again")
    assert again.returncode == 0, again.stderr
    assert log.tail(running.tab_id)[-1].type == "text"


# --- How the turn ended, in the exit status -----------------------------------------


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_it_exits_1_saying_why_when_the_turn_ends_in_an_error(workspace):
    done = send(workspace, "--new", "--model", "nowhere/model", "hi")
    assert done.returncode == 1
    assert last_line(done.stderr) == (
        "CommandError: the turn ended with an error: unknown model provider 'nowhere' in "
        "'nowhere/model' (known: anthropic, deepseek, offline, openai)"
    )


def test_it_exits_1_saying_why_when_the_runner_crashes(workspace):
    """A tab whose log no request can hold: the runner crashes before its first step."""
    owner = get_user_model().objects.create_superuser("owner", password="pw")
    tab = new_tab(owner, "offline/demo")
    log.append(tab.pk, [Block(uuid.uuid4(), None, 0, "tool", "text", {"text": "bad"})])
    done = send(workspace, "--tab", str(tab.pk), "hi")
    assert done.returncode == 1
    assert last_line(done.stderr) == (
        "CommandError: the turn ended with an error: Internal error in the turn runner: "
        "ValueError: chunk 1: a 'tool' 'text' chunk cannot be sent"
    )
    assert not RunningTurn.objects.exists()


class EndsMidStream:
    """A provider that, once it has said something, interrupts (the worker shutting
    down) or stops (the user) the turn that is streaming it."""

    idle_timeout = 60.0

    def __init__(self, stopping: bool) -> None:
        self.stopping = stopping

    async def stream(self, request):
        yield TextDelta("Once upon")
        for runner in list(worker.RUNNING.values()):
            runner.cancel(stopping=self.stopping)
        await asyncio.Event().wait()  # cancelled by the line above


@pytest.mark.parametrize(
    ("stopping", "reason"),
    [
        (
            True,
            "the turn was interrupted: The server shut down in the middle of this turn. "
            "Send a message to go on.",
        ),
        (False, "the turn was stopped: Stopped by the user."),
    ],
)
def test_it_fails_saying_why_when_the_turn_is_interrupted_or_stopped(
    workspace, monkeypatch, settings, stopping, reason
):
    """In-process (the provider is a test double): the command raises CommandError, which
    manage.py turns into exit status 1 with the reason on stderr."""
    settings.DISPATCH_WORKSPACE = workspace

    async def provider_for(model: str):
        return EndsMidStream(stopping)

    monkeypatch.setattr(step, "provider_for", provider_for)
    get_user_model().objects.create_superuser("owner", password="pw")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("send", "--new", "--model", "offline/demo", "hi", stdout=out, stderr=err)
    assert str(raised.value) == reason
    assert "Once upon" in out.getvalue()
    assert not RunningTurn.objects.exists()


@pytest.mark.parametrize(
    ("streamed", "printed"),
    [
        ("\x1b[2J\x1b[HRun rm -rf? [y/N]", "[2J[HRun rm -rf? [y/N]"),
        ("\x1b]52;c;ZXZpbA==\x07copied", "]52;c;ZXZpbA==copied"),
        ("progress 10%\rprogress 90%", "progress 10%\nprogress 90%"),
        ("line\r\nnext\tcol", "line\nnext\tcol"),
        ("\x9b31mC1 CSI\x7f", "31mC1 CSI"),
        ("plain ünïcödé ✓", "plain ünïcödé ✓"),
    ],
)
def test_text_output_cannot_drive_the_terminal(streamed, printed):
    """Model or tool output with escape sequences prints without its control characters."""
    out, err = io.StringIO(), io.StringIO()
    printer = TextPrinter(OutputWrapper(out), OutputWrapper(err))
    printer.op({"op": "delta", "chunk_id": "x", "offset": 0, "text": streamed})
    printer.op(
        {
            "op": "seal",
            "block": {"type": "error", "role": "assistant", "data": {"message": streamed}},
        }
    )
    assert out.getvalue() == printed
    assert err.getvalue() == f"✗ error: {printed}\n"
