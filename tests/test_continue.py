"""Continue (ARCHITECTURE.md, Branches and continue) through the real turn runner and the
Anthropic SDK against the fake server: for each way a turn is cut short (Stop during text,
thinking or a shell call; a server crash during text or a shell call, or a shutdown during
one; the output or context limit; an error; the step limit), the message Continue sends says
what was interrupted and where, and the continue turn's request follows the rules:
interrupted text is sent as the user saw it, thinking cut off before its signature is not
sent, an interrupted call is answered with an is_error result and never run again. A turn
recovered after a crash or a shutdown waits for the user. Continue with nothing to continue
is refused and queues nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import log, resume, turns
from chat.models import Chunk, QueuedMessage, RunningTurn, Setting, Tab
from chat.turn import lease, loop
from harness.fakeprovider import STALL, Reply
from tests.anthropic_wire import (
    MODEL,
    POLL_SECONDS,
    Body,
    reply,
    settled,
    stream_error,
    text,
    thinking,
    tool_use,
    use_anthropic,
)
from tests.engine import (
    TURN_TIMEOUT,
    Watcher,
    chunks,
    kinds,
    make_tab,
    owner_workspace,
    running_worker,
    submit,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUESTION = "What is the answer?"
# Appends a line to a file of the workspace each time it runs, prints, then runs
# until it is stopped: how many lines the file has is how many times it ran.
LONG_COMMAND = "echo ran >> runs.log; echo started; sleep 60"
# Never runs in these tests (the call before it is interrupted).
NEXT_COMMAND = "echo ran >> next.log"
# The same as LONG_COMMAND without printing anything: running all the same.
SILENT_COMMAND = "echo ran >> runs.log; sleep 60"
# A worker on another host that stopped beating: its lease is dead once stale.
DEAD_WORKER = "elsewhere:1:crashed"


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


@pytest.fixture(autouse=True)
def anthropic(monkeypatch, fake_server):
    use_anthropic(monkeypatch, fake_server)


async def run_one(tab: Tab, message: str) -> Watcher:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, message)
        await watcher.until_idle()
    await settled(tab.pk)
    return watcher


async def continue_and_run(tab: Tab) -> str:
    """Continue the tab's last turn and run the continue turn; its message's text."""
    async with Watcher(tab.pk) as watcher:
        queued = await database_sync_to_async(turns.continue_turn)(tab)
        await watcher.until_idle()
    await settled(tab.pk)
    return queued.text


async def until_seen(watcher: Watcher, needle: str) -> None:
    """Wait until the deltas sent to the page hold `needle`."""
    await watcher.until(lambda m: m["op"] == "delta" and needle in seen(watcher))


def seen(watcher: Watcher, chunk_id: Any = None) -> str:
    """The streamed text the page was sent (of one chunk, if given), in order."""
    ops = [
        m
        for m in watcher.ops
        if m["op"] == "delta" and chunk_id in (None, uuid.UUID(m["chunk_id"]))
    ]
    return "".join(m["text"] for m in ops)


async def stop(tab: Tab, watcher: Watcher) -> None:
    assert await database_sync_to_async(turns.cancel)(tab.pk)
    await watcher.until_idle()
    # Idle goes out just before the lease is released (chat/turn/loop.py).
    await settled(tab.pk)


def messages(fake_server, index: int) -> list[dict[str, Any]]:
    """A request's messages as sent, cache markers removed."""
    return json.loads(Body.of(fake_server.requests[index].body).text)["messages"]


def text_part(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def assert_continues(message: str, first_line: str, *, calls_cut: bool = False) -> None:
    """The Continue message: what stopped and where, then what to do about it (and,
    when a call was cut short, not to run it again blindly)."""
    advice = f"{resume.GO_ON} {resume.NOT_AGAIN}" if calls_cut else resume.GO_ON
    assert message == f"{first_line}\n\n{advice}"


# --- Stop ----------------------------------------------------------------------------


async def test_continue_after_a_stop_during_text(fake_server, workspace):
    """Signed thinking, then text stopped mid-way: the message quotes where the text
    stopped; the request replays the thinking with its signature and the text exactly
    as the page was sent it."""
    fake_server.add(
        reply(
            thinking("Work it out.", "sig-1"),
            text("The answer so far", " is forty", stop=False),
            stop=None,
            then=[STALL],
        ),
        reply(text("-two.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, QUESTION)
            await until_seen(watcher, "is forty")
            await stop(tab, watcher)
        rows = await chunks(tab.pk)
        assert kinds(rows) == [
            "user/text",
            "assistant/thinking",
            "assistant/text",
            "system/system",
        ]
        assert rows[-1].data["kind"] == "cancelled"
        shown = seen(watcher, rows[2].id)
        assert shown == rows[2].data["text"] == "The answer so far is forty"
        message = await continue_and_run(tab)
    assert_continues(
        message,
        "I stopped your previous reply. You were writing; your text ends with: "
        "“The answer so far is forty”",
    )
    assert messages(fake_server, 1) == [
        {"role": "user", "content": [text_part(QUESTION)]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Work it out.", "signature": "sig-1"},
                text_part(shown),
            ],
        },
        {"role": "user", "content": [text_part(message)]},
    ]
    assert len(fake_server.requests) == 2


async def test_continue_after_a_stop_during_thinking(fake_server, workspace):
    """Thinking stopped before its signature is lost: the message says so, and the
    request has no thinking (Anthropic rejects it unsigned), so no assistant message."""
    fake_server.add(
        reply(thinking("Let me weigh the options", None), stop=None, then=[STALL]),
        reply(text("Forty-two.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, QUESTION)
            await until_seen(watcher, "options")
            await stop(tab, watcher)
        rows = await chunks(tab.pk)
        assert kinds(rows) == ["user/text", "assistant/thinking", "system/system"]
        assert rows[1].data["interrupted"] is True and "signature" not in rows[1].data
        message = await continue_and_run(tab)
    assert_continues(
        message, "I stopped your previous reply. You were thinking (that thinking is lost)."
    )
    assert messages(fake_server, 1) == [
        {"role": "user", "content": [text_part(QUESTION), text_part(message)]}
    ]
    assert b"weigh the options" not in fake_server.requests[1].body


async def test_continue_after_a_stop_during_a_shell_call(fake_server, workspace):
    """Stopped while the first of two shell calls runs: its result is an error with the
    output so far, the second never ran; the message names both, and the continue turn
    runs neither again."""
    fake_server.add(
        reply(
            tool_use("toolu_long", "shell", command=LONG_COMMAND),
            tool_use("toolu_next", "shell", command=NEXT_COMMAND),
            stop="tool_use",
        ),
        reply(text("I will not run them again.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "Run the tests.")
            await until_seen(watcher, "started")
            await stop(tab, watcher)
        rows = await chunks(tab.pk)
        assert kinds(rows) == [
            "user/text",
            "assistant/tool_call",
            "assistant/tool_call",
            "tool/tool_result",
            "tool/tool_result",
            "system/system",
        ]
        running, never = rows[3].data, rows[4].data
        assert running["is_error"] is True and running["shell_output"] == "started\n"
        assert never["is_error"] is True and "shell_output" not in never
        message = await continue_and_run(tab)
    assert_continues(
        message,
        f"I stopped your previous reply. `shell: {LONG_COMMAND}` was running: its exit "
        "status is unknown, and its output so far is in its result. "
        f"`shell: {NEXT_COMMAND}` was not run.",
        calls_cut=True,
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    assert not (workspace / "next.log").exists()
    assert len(fake_server.requests) == 2
    last = messages(fake_server, 1)[-1]
    assert last["role"] == "user"
    results, words = last["content"][:2], last["content"][2:]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [
        ("toolu_long", True),
        ("toolu_next", True),
    ]
    # The message says the output so far is in the result: the model is shown it.
    assert results[0]["content"] == "started\n[Cancelled by the user.]"
    assert results[1]["content"] == "Cancelled by the user."
    assert words == [text_part(message)]


async def until_exists(path) -> None:
    async with asyncio.timeout(TURN_TIMEOUT):
        while not path.exists():
            await asyncio.sleep(POLL_SECONDS)


async def test_continue_after_a_stop_during_a_silent_shell_call(fake_server, workspace):
    """A command stopped before it printed anything was running all the same: the
    message must not say it was not run (the model would run it a second time)."""
    fake_server.add(
        reply(tool_use("toolu_silent", "shell", command=SILENT_COMMAND), stop="tool_use"),
        reply(text("It was stopped.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "Run it.")
            await until_exists(workspace / "runs.log")
            await stop(tab, watcher)
        result = (await chunks(tab.pk))[2].data
        assert result["interrupted"] is True and result["shell_output"] == ""
        message = await continue_and_run(tab)
    assert_continues(
        message,
        f"I stopped your previous reply. `shell: {SILENT_COMMAND}` was running: its exit "
        "status is unknown, and its output so far is in its result.",
        calls_cut=True,
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    answer = messages(fake_server, 1)[-1]["content"][0]
    assert answer["tool_use_id"] == "toolu_silent" and answer["is_error"] is True
    assert answer["content"] == "Cancelled by the user."


# --- A server crash -------------------------------------------------------------------


async def crash(tab: Tab, ready) -> dict[str, Any] | None:
    """Run the tab's queued message in a runner that dies once `ready(checkpoint)` (the
    open block as last checkpointed, or None): no seal, no notice, its lease left
    behind (stale) with that checkpoint, as after a SIGKILL. Returns the checkpoint."""
    turn_id = await database_sync_to_async(lease.acquire)(tab.pk, DEAD_WORKER)

    async def publish(op: dict[str, Any]) -> None:
        pass

    def checkpointed() -> dict[str, Any] | None:
        block = log.checkpointed(tab.pk)
        return block.to_dict() if block is not None else None

    task = asyncio.create_task(loop.TurnRunner(tab.pk, turn_id, publish).run())
    try:
        async with asyncio.timeout(TURN_TIMEOUT):
            while not ready(await database_sync_to_async(checkpointed)()):
                await asyncio.sleep(POLL_SECONDS)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    stale = timezone.now() - timedelta(seconds=lease.LEASE_STALE_SECONDS * 4)
    await RunningTurn.objects.filter(tab_id=tab.pk).aupdate(heartbeat_at=stale)
    return await database_sync_to_async(checkpointed)()


async def assert_waits_for_the_user(fake_server, tab: Tab) -> None:
    """With a worker running, a recovered turn is not run again: another tab's turn
    goes through the worker, and the model heard nothing from this one."""
    before = [(c.seq, c.data) for c in await chunks(tab.pk)]
    requests = len(fake_server.requests)
    other = await make_tab(MODEL)
    fake_server.add(reply(text("Other tab's answer.")))
    await run_one(other, "A question in another tab.")
    assert len(fake_server.requests) == requests + 1
    assert b"another tab" in fake_server.requests[-1].body
    assert not await RunningTurn.objects.filter(tab_id=tab.pk).aexists()
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()
    assert [(c.seq, c.data) for c in await chunks(tab.pk)] == before


@pytest.mark.parametrize("going_on", ["continue", "send"])
async def test_a_crash_during_text_waits_for_the_user_then_goes_on(
    fake_server, workspace, going_on
):
    """The server dies mid-answer; recovery seals the text as last checkpointed and
    the model is not called again until the user continues (the message quotes where
    the text stopped) or sends a message; either way the text is sent as saved."""
    fake_server.add(
        reply(text("Half of the answer", stop=False), stop=None, then=[STALL]),
    )
    tab = await make_tab(MODEL)
    await submit(tab, QUESTION)
    saved = await crash(
        tab, lambda block: block is not None and block["data"]["text"] == "Half of the answer"
    )
    assert await database_sync_to_async(lease.recover_stale)() == [tab.pk]
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[1].data == {**saved["data"], "interrupted": True}
    assert rows[2].data["kind"] == "interrupted"
    async with running_worker():
        await assert_waits_for_the_user(fake_server, tab)
        fake_server.add(reply(text(" and the rest.")))
        if going_on == "continue":
            said = await continue_and_run(tab)
            assert_continues(
                said,
                "The server restarted in the middle of your previous reply. You were "
                "writing; your text ends with: “Half of the answer”",
            )
        else:
            said = "Go on."
            await run_one(tab, said)
    assert len(fake_server.requests) == 3
    assert messages(fake_server, 2) == [
        {"role": "user", "content": [text_part(QUESTION)]},
        {"role": "assistant", "content": [text_part("Half of the answer")]},
        {"role": "user", "content": [text_part(said)]},
    ]


async def test_a_crash_during_a_shell_call_is_recovered_by_the_worker_and_never_rerun(
    fake_server, workspace
):
    """The server dies while a shell command runs. The worker's recovery scan closes the
    turn (the output so far kept, an error result); the model is not called until the
    user continues; the message names the call and says its exit status is unknown;
    the command is not run again."""
    fake_server.add(
        reply(tool_use("toolu_long", "shell", command=LONG_COMMAND), stop="tool_use"),
    )
    tab = await make_tab(MODEL)
    await submit(tab, "Run the tests.")
    await crash(
        tab,
        lambda block: (
            block is not None
            and block["type"] == "tool_result"
            and block["data"].get("shell_output") == "started\n"
        ),
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    async with Watcher(tab.pk) as watcher, running_worker():
        await watcher.until(
            lambda m: m["op"] == "seal" and m["block"]["data"].get("kind") == "interrupted"
        )
        rows = await chunks(tab.pk)
        assert kinds(rows) == [
            "user/text",
            "assistant/tool_call",
            "tool/tool_result",
            "system/system",
        ]
        result = rows[2].data
        assert result["is_error"] is True and result["interrupted"] is True
        assert result["shell_output"] == "started\n"
        await assert_waits_for_the_user(fake_server, tab)
        fake_server.add(reply(text("The tests were interrupted; shall I run them?")))
        message = await continue_and_run(tab)
    assert_continues(
        message,
        "The server restarted in the middle of your previous reply. "
        f"`shell: {LONG_COMMAND}` was running: its exit status is unknown, and its output so "
        "far is in its result.",
        calls_cut=True,
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    assert len(fake_server.requests) == 3
    last = messages(fake_server, 2)[-1]
    answer, words = last["content"]
    assert answer["type"] == "tool_result" and answer["tool_use_id"] == "toolu_long"
    assert answer["is_error"] is True
    assert answer["content"] == "started\n[Interrupted: the server stopped while this call ran.]"
    assert words == text_part(message)


async def test_a_crash_during_a_silent_shell_call_says_it_was_running(fake_server, workspace):
    """The server dies while a command that printed nothing runs: recovery must not
    report it as never run, since it did run (its exit status is what is unknown)."""
    fake_server.add(
        reply(tool_use("toolu_silent", "shell", command=SILENT_COMMAND), stop="tool_use"),
        reply(text("It was interrupted.")),
    )
    tab = await make_tab(MODEL)
    await submit(tab, "Run it.")
    await crash(tab, lambda block: (workspace / "runs.log").exists())
    assert await database_sync_to_async(lease.recover_stale)() == [tab.pk]
    result = (await chunks(tab.pk))[2].data
    assert result["result"] == "Interrupted: the server stopped while this call ran."
    assert result["interrupted"] is True and result["shell_output"] == ""
    async with running_worker():
        message = await continue_and_run(tab)
    assert_continues(
        message,
        "The server restarted in the middle of your previous reply. "
        f"`shell: {SILENT_COMMAND}` was running: its exit status is unknown, and its output "
        "so far is in its result.",
        calls_cut=True,
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    assert len(fake_server.requests) == 2


async def test_continue_after_a_shutdown_during_a_shell_call(fake_server, workspace, settings):
    """The server is stopped (a deploy) while a command runs, past its grace period: the
    running turn is interrupted (the command killed, the output kept); after the restart
    the model is not called until the user continues, and the command is not run again."""
    settings.DISPATCH_SHUTDOWN_GRACE = 0
    fake_server.add(
        reply(tool_use("toolu_long", "shell", command=LONG_COMMAND), stop="tool_use"),
    )
    tab = await make_tab(MODEL)
    async with Watcher(tab.pk) as watcher:
        async with running_worker():
            await submit(tab, "Run the tests.")
            await until_seen(watcher, "started")
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows)[-2:] == ["tool/tool_result", "system/system"]
    assert rows[-2].data["shell_output"] == "started\n" and rows[-2].data["is_error"] is True
    assert rows[-1].data["kind"] == "interrupted"
    async with running_worker():
        await assert_waits_for_the_user(fake_server, tab)
        fake_server.add(reply(text("Shall I run them again?")))
        message = await continue_and_run(tab)
    assert_continues(
        message,
        "The server restarted in the middle of your previous reply. "
        f"`shell: {LONG_COMMAND}` was running: its exit status is unknown, and its output so "
        "far is in its result.",
        calls_cut=True,
    )
    assert (workspace / "runs.log").read_text() == "ran\n"
    answer = messages(fake_server, 2)[-1]["content"][0]
    assert answer["tool_use_id"] == "toolu_long" and answer["is_error"] is True
    assert answer["content"] == ("started\n[Interrupted: the worker running this turn shut down.]")


# --- Limits and errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop_reason", "kind", "ending"),
    [
        ("max_tokens", "output-limit", "Your previous reply was cut off at the output limit."),
        (
            "model_context_window_exceeded",
            "context-limit",
            "Your previous reply stopped because the conversation filled your context window.",
        ),
    ],
)
async def test_continue_after_a_limit(fake_server, workspace, stop_reason, kind, ending):
    fake_server.add(
        reply(text("It all began"), stop=stop_reason),
        reply(text(" long ago.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "Tell me everything.")
        assert (await chunks(tab.pk))[-1].data["kind"] == kind
        message = await continue_and_run(tab)
    assert_continues(message, f"{ending} You were writing; your text ends with: “It all began”")
    assert messages(fake_server, 1) == [
        {"role": "user", "content": [text_part("Tell me everything.")]},
        {"role": "assistant", "content": [text_part("It all began")]},
        {"role": "user", "content": [text_part(message)]},
    ]


@pytest.mark.parametrize(
    ("failure", "first_line", "assistant"),
    [
        (
            reply(
                thinking("Plan.", "sig-e"),
                text("Halfway th", stop=False),
                stop=None,
                then=[stream_error("invalid_request_error", "Output blocked.")],
            ),
            "Your previous reply stopped on an error: Anthropic error in the stream "
            "(invalid_request_error): Output blocked. You were writing; your text ends with: "
            "“Halfway th”",
            [
                {"type": "thinking", "thinking": "Plan.", "signature": "sig-e"},
                text_part("Halfway th"),
            ],
        ),
        (
            reply(
                thinking("Unsigned pla", None),
                stop=None,
                then=[stream_error("invalid_request_error", "Output blocked.")],
            ),
            "Your previous reply stopped on an error: Anthropic error in the stream "
            "(invalid_request_error): Output blocked. You were thinking (that thinking is lost).",
            None,
        ),
        (
            Reply.error(400, "invalid_request_error", "Bad request."),
            "Your previous reply stopped on an error: Anthropic error 400 "
            "(invalid_request_error): Bad request. You had not written anything yet.",
            None,
        ),
    ],
    ids=["mid-text", "mid-thinking", "http-400"],
)
async def test_continue_after_an_error(fake_server, workspace, failure, first_line, assistant):
    """An error chunk ends the turn: the message says where and quotes the error; what
    was streamed before it is sent as shown, except thinking that was never signed."""
    fake_server.add(failure, reply(text("Done.")))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, QUESTION)
        assert (await chunks(tab.pk))[-1].type == "error"
        message = await continue_and_run(tab)
    assert_continues(message, first_line)
    if assistant is None:
        expected = [{"role": "user", "content": [text_part(QUESTION), text_part(message)]}]
    else:
        expected = [
            {"role": "user", "content": [text_part(QUESTION)]},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": [text_part(message)]},
        ]
    assert messages(fake_server, 1) == expected
    assert b"Unsigned pla" not in fake_server.requests[1].body


async def test_continue_after_the_step_limit(fake_server, workspace):
    """Stopped after its two steps' tools ran: the message says so; the continue turn
    answers from the results and runs nothing again."""
    await Setting.objects.acreate(key="max_steps", value=2)
    fake_server.add(
        reply(tool_use("toolu_1", "shell", command="echo ran >> runs.log"), stop="tool_use"),
        reply(tool_use("toolu_2", "shell", command="echo ran >> runs.log"), stop="tool_use"),
        reply(text("It ran twice.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "Run it until it works.")
        rows = await chunks(tab.pk)
        assert kinds(rows)[-2:] == ["tool/tool_result", "system/system"]
        assert rows[-1].data["kind"] == "step-limit"
        message = await continue_and_run(tab)
    assert_continues(
        message, "Your previous reply stopped at the step limit. Its last tool results are above."
    )
    assert (workspace / "runs.log").read_text() == "ran\nran\n"
    assert len(fake_server.requests) == 3
    result, words = messages(fake_server, 2)[-1]["content"]
    assert result["tool_use_id"] == "toolu_2" and "is_error" not in result
    assert words == text_part(message)


# --- Nothing to continue ----------------------------------------------------------------


async def refused(tab: Tab, reason: str) -> None:
    """Continue is refused with `reason`, and nothing is queued or sent."""
    queued = await database_sync_to_async(list)(
        QueuedMessage.objects.filter(tab_id=tab.pk).values_list("pk", "text", "rerun")
    )
    count = await Chunk.objects.filter(tab_id=tab.pk).acount()
    with pytest.raises(ValueError) as caught:
        await database_sync_to_async(turns.continue_turn)(tab)
    assert str(caught.value) == reason
    assert (
        await database_sync_to_async(list)(
            QueuedMessage.objects.filter(tab_id=tab.pk).values_list("pk", "text", "rerun")
        )
        == queued
    )
    assert await Chunk.objects.filter(tab_id=tab.pk).acount() == count


async def test_continue_is_refused_when_the_last_turn_finished(fake_server, workspace):
    fake_server.add(reply(text("Forty-two.")))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, QUESTION)
        await refused(tab, resume.NOTHING)
    assert len(fake_server.requests) == 1


async def test_continue_is_refused_on_an_empty_tab(fake_server, workspace):
    tab = await make_tab(MODEL)
    await refused(tab, resume.EMPTY)
    assert fake_server.requests == []


async def test_continue_is_refused_while_a_turn_runs(fake_server, workspace):
    fake_server.add(reply(text("Still ", stop=False), stop=None, then=[STALL]))
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, QUESTION)
            await until_seen(watcher, "Still")
            await refused(tab, "A turn is running: wait for it to end, or stop it, first.")
            await stop(tab, watcher)
    assert len(fake_server.requests) == 1


async def test_continue_is_refused_while_a_message_waits(fake_server, workspace):
    """A second Continue (a double click) while the first one's message waits for a
    worker: refused, the first message left as it is."""
    fake_server.add(reply(text("It all began"), stop="max_tokens"))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "Tell me everything.")
    await database_sync_to_async(turns.continue_turn)(tab)
    await refused(tab, "A message is already waiting to start the next turn.")
    assert await QueuedMessage.objects.filter(tab_id=tab.pk).acount() == 1
    assert len(fake_server.requests) == 1
