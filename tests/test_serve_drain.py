"""`manage.py serve` stopped by a signal drains like runworker: a real process, a real signal."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from chat import log, worker
from chat.models import Chunk, QueuedMessage, RunningTurn, Setting, Tab
from chat.preferences import new_tab

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Every wait on the live server: generous for a loaded CI machine.
WAIT_SECONDS = 20.0
POLL_SECONDS = 0.05


def owner_tab() -> Tab:
    owner = get_user_model().objects.create_user("drain-owner", password="x")
    Setting.objects.update_or_create(key="approve_tools", defaults={"value": False})
    return new_tab(owner, "offline/demo")


async def until(predicate, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if value := await asyncio.to_thread(predicate):
            return value
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out waiting for {what}")


def open_text(tab: Tab) -> str:
    block = log.checkpointed(tab.pk)
    return block.text if block is not None else ""


def stop(live, sig: int = signal.SIGTERM) -> int:
    live.proc.send_signal(sig)
    try:
        return live.proc.wait(WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        live.proc.kill()
        raise AssertionError(f"serve did not exit after {sig!r}:\n{live.log_tail()}") from None


def log_of(tab: Tab) -> list[Chunk]:
    return list(Chunk.objects.filter(tab=tab).order_by("seq"))


async def test_sigterm_lets_the_running_turn_finish_then_exits(serve):  # noqa: F811
    """Stopped mid-sentence: the answer is finished and sealed, the lease released."""
    tab = await asyncio.to_thread(owner_tab)
    # Queued before the start: the server's first recovery scan asks for the run.
    await QueuedMessage.objects.acreate(tab=tab, text="hello there")
    live = await serve(DISPATCH_OFFLINE_PACE="30", DISPATCH_SHUTDOWN_GRACE="15")
    await until(lambda: len(open_text(tab)) > 20, "the answer to stream")

    assert await asyncio.to_thread(stop, live) == 0

    rows = await asyncio.to_thread(log_of, tab)
    assert [(c.role, c.type) for c in rows][-1] == ("assistant", "text")
    answer = rows[-1].data
    assert "interrupted" not in answer
    assert answer["text"].startswith(await asyncio.to_thread(open_text_was, rows))
    assert not any(c.type == "system" for c in rows), [c.data for c in rows]
    assert not await RunningTurn.objects.aexists()
    assert "waiting up to 15s for 1 running turn(s)" in live.log()


def open_text_was(rows: list[Chunk]) -> str:
    """The answer's first words: a finished answer is longer than what was streamed
    when the signal came, and starts the same way."""
    return rows[-1].data["text"][:20]


async def test_past_the_grace_period_the_turn_is_interrupted_and_its_tool_killed(
    serve,  # noqa: F811
):
    """A shell call outlasting the grace: killed with everything it started, the log
    says the server shut down, the call has its result, the lease is released."""
    marker = f"drain-{uuid.uuid4().hex}"
    tab = await asyncio.to_thread(owner_tab)
    command = f"echo started; python3 -c 'import time; time.sleep(300)' {marker}"
    await QueuedMessage.objects.acreate(tab=tab, text=f"please run `{command}`")
    live = await serve(DISPATCH_OFFLINE_PACE="0", DISPATCH_SHUTDOWN_GRACE="0.5")
    await until(lambda: "started" in open_text(tab), "the command to start")
    assert _processes_with(marker), "the command is not running"

    started = time.monotonic()
    assert await asyncio.to_thread(stop, live) == 0
    assert time.monotonic() - started < WAIT_SECONDS

    assert _processes_with(marker) == []
    rows = await asyncio.to_thread(log_of, tab)
    result = next(c for c in rows if c.type == "tool_result")
    assert result.data["is_error"] is True
    assert "shut down" in result.data["result"]
    assert result.data["shell_output"].startswith("started")
    assert rows[-1].type == "system" and rows[-1].data["kind"] == "interrupted"
    assert not await RunningTurn.objects.aexists()


async def test_a_second_signal_skips_the_rest_of_the_grace_period(serve):  # noqa: F811
    tab = await asyncio.to_thread(owner_tab)
    await QueuedMessage.objects.acreate(tab=tab, text="hello there")
    live = await serve(DISPATCH_OFFLINE_PACE="2", DISPATCH_SHUTDOWN_GRACE="600")
    await until(lambda: open_text(tab), "the answer to stream")

    live.proc.send_signal(signal.SIGTERM)
    await until(lambda: "waiting up to" in live.log(), "the drain to start")
    assert await asyncio.to_thread(stop, live, signal.SIGINT) == 0

    rows = await asyncio.to_thread(log_of, tab)
    # What had streamed of the open block (thinking, at this pace) is sealed as it was.
    assert rows[-2].role == "assistant" and rows[-2].data["text"]
    assert rows[-1].type == "system" and rows[-1].data["kind"] == "interrupted"
    assert not await RunningTurn.objects.aexists()


def _processes_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(proc.name))
    return found


async def test_a_request_during_the_drain_starts_no_second_worker(monkeypatch):
    """Every request calls start_embedded_worker (plain daphne's start): one arriving
    while serve drains, or after, must not start a worker that takes turns again."""
    monkeypatch.setattr(worker, "_embedded_task", None)
    worker.start_embedded_worker()
    first = worker._embedded_task
    stopping = asyncio.create_task(worker.stop_embedded_worker())
    await asyncio.sleep(0)
    worker.start_embedded_worker()
    assert worker._embedded_task is first
    await stopping
    worker.start_embedded_worker()
    assert worker._embedded_task is first and first.done()
