"""The turn engine: full turns through the worker, with a scripted provider at the boundary."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from django.db import transaction

from chat import bus, log, render, resume, retry, turns, worker
from chat.models import (
    CheckpointPiece,
    Chunk,
    QueuedMessage,
    RunningTurn,
    Setting,
    UsageRecord,
)
from chat.providers.base import (
    Finish,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallEvent,
    ToolResultPart,
    Usage,
)
from chat.providers.replay import ScriptedProvider
from chat.turn import calls, ending, lease, loop, step
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello from notes\n")
    return workspace


def think(text: str, signature: str) -> list:
    return [ReasoningDelta(text), ReasoningEnd(signature=signature)]


def call(call_id: str, name: str, **arguments) -> ToolCallEvent:
    return ToolCallEvent(call_id, name, arguments)


async def run_one(tab, text: str, **kwargs):
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text, **kwargs)
        await watcher.until_idle()
    return watcher


async def test_it_runs_a_multi_step_tool_turn_with_interleaved_thinking(script, workspace):
    """Thinking, text and a tool call; the result; then a second step that sees the result."""
    provider = script(
        [
            *think("Look first.", "sig-1"),
            TextDelta("Let me "),
            TextDelta("look."),
            call("toolu_1", "list_files", path="."),
            Finish(Usage(10, 5, 3, 2), "tool_use"),
        ],
        [
            *think("Got it.", "sig-2"),
            TextDelta("There is notes.txt."),
            Finish(Usage(20, 6), "end_turn"),
        ],
    )
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "what is here?")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/thinking",
        "assistant/text",
    ]
    assert [c.seq for c in rows] == list(range(1, 8))
    thinking = dict(rows[1].data)
    assert isinstance(thinking.pop("duration_ms"), int)
    assert thinking == {"text": "Look first.", "signature": "sig-1"}
    assert rows[2].data["text"] == "Let me look."
    assert "notes.txt" in rows[4].data["result"] and rows[4].data["is_error"] is False
    assert [c.step for c in rows] == [0, 1, 1, 1, 1, 2, 2]
    # The second request replays the first step and answers its call.
    second = provider.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "user"]
    assert second[1].parts[0].signature == "sig-1"
    assert (
        isinstance(second[2].parts[0], ToolResultPart) and second[2].parts[0].call_id == "toolu_1"
    )
    # Usage per step is kept, and the turn's totals reach the watchers.
    records = await database_sync_to_async(list)(UsageRecord.objects.order_by("step"))
    assert [(r.step, r.input_tokens, r.cache_read_tokens) for r in records] == [
        (1, 10, 3),
        (2, 20, 0),
    ]
    idle = watcher.ops[-1]["status"]
    assert idle["usage"] == {"input": 30, "output": 11, "cache_read": 3, "cache_write": 2}
    assert not await RunningTurn.objects.aexists()


async def test_it_runs_parallel_tool_calls_in_order(script, workspace):
    """Two calls in one response get two results, in call order, before the next step."""
    provider = script(
        [
            call("a", "read_file", path="notes.txt"),
            call("b", "list_files", path="."),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("Both done."), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "read and list")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "assistant/tool_call",
        "tool/tool_result",
        "tool/tool_result",
        "assistant/text",
    ]
    assert [r.data["call_id"] for r in rows[3:5]] == ["a", "b"]
    assert "hello from notes" in rows[3].data["result"]
    results = provider.requests[1].messages[-1].parts
    assert [p.call_id for p in results] == ["a", "b"]


async def test_a_tool_error_is_a_result_and_the_turn_goes_on(script, workspace):
    script(
        [call("x", "read_file", path="missing.txt"), Finish(stop_reason="tool_use")],
        [TextDelta("That file does not exist."), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "read missing.txt")
    rows = await chunks(tab.pk)
    assert kinds(rows)[-2:] == ["tool/tool_result", "assistant/text"]
    assert rows[-2].data["is_error"] is True
    assert "missing.txt" in rows[-2].data["result"]


async def test_it_stops_at_the_step_limit(script, workspace):
    """A model that always calls a tool is stopped after max_steps with a notice. (Its
    calls differ: the same call three times in a row would stop to ask the user first,
    see test_turns_repeats.)"""
    loop_step = [call("c", "list_files", path="."), Finish(stop_reason="tool_use")]
    provider = script(
        *[
            [call(f"c{i}", "list_files", path="." + "/" * (i % 2)), Finish(stop_reason="tool_use")]
            for i in range(5)
        ]
    )
    assert loop_step
    await database_sync_to_async(Setting.objects.create)(key="max_steps", value=3)
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "loop")
    rows = await chunks(tab.pk)
    assert len(provider.requests) == 3
    assert rows[-1].type == "system" and rows[-1].data["kind"] == "step-limit"
    assert "3 steps" in rows[-1].data["text"]


async def test_a_non_retryable_error_ends_the_turn_with_an_error_chunk(script, workspace):
    script([TextDelta("Partial"), ProviderError("invalid x-api-key", status_code=401)])
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "assistant/error"]
    assert rows[-1].data == {
        "message": "invalid x-api-key",
        "status_code": 401,
        "summary": "The scripted provider did not accept the API key",
        "hint": "Check the provider's API key, then Retry.",
        # A refused key is fixed in Settings → Connections (the card links there).
        "fix": "connections",
    }


async def test_retryable_errors_are_retried_then_the_fallback_model_takes_over(
    script, workspace, monkeypatch
):
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01))
    monkeypatch.setattr(retry, "JITTER", 0)
    overloaded = ProviderError("Overloaded", status_code=529, retryable=True, retry_after=0.01)
    main = ScriptedProvider([[overloaded]] * 3)
    fallback = ScriptedProvider([[TextDelta("From the fallback."), Finish()]])
    script(models={"scripted/main": main, "scripted/fallback": fallback})
    await database_sync_to_async(Setting.objects.create)(
        key="fallback_model", value="scripted/fallback"
    )
    async with running_worker():
        tab = await make_tab("scripted/main")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    notices = [r.data for r in rows if r.type == "system"]
    assert [n["kind"] for n in notices] == ["notice", "notice", "model-changed"]
    assert "retrying" in notices[0]["text"] and "529" in notices[0]["text"]
    assert notices[2]["text"].startswith("Switched to scripted/fallback")
    assert rows[-1].data["text"] == "From the fallback."


async def test_cancel_during_text_seals_what_streamed(script, workspace):
    script(
        [TextDelta("one "), TextDelta("two "), *[TextDelta("more ")] * 200, Finish()], delay=0.02
    )
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "talk")
            await watcher.until(lambda m: m["op"] == "delta")
            assert await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[1].data["text"].startswith("one ")
    assert rows[2].data["kind"] == "cancelled"
    assert not await RunningTurn.objects.aexists()


async def test_cancel_during_thinking_keeps_the_thinking(script, workspace):
    script([*[ReasoningDelta("hmm ")] * 200, ReasoningEnd("sig"), Finish()], delay=0.02)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "think")
            await watcher.until(lambda m: m["op"] == "delta")
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/thinking", "system/system"]
    assert rows[1].data["text"].startswith("hmm")
    assert "signature" not in rows[1].data


def _processes_with(marker: str) -> list[str]:
    """Host processes whose command line holds `marker` (pids inside the sandbox are its own)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(entry)
            except OSError:
                pass
    return found


async def test_cancel_during_a_shell_command_kills_its_process_group(script, workspace):
    marker = f"cancel-{uuid.uuid4().hex}"
    command = f"echo started; bash -c 'exec -a {marker} sleep 60' & sleep 60"
    script([call("s", "shell", command=command), Finish(stop_reason="tool_use")])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "run it")
            await watcher.until(lambda m: m["op"] == "delta" and "started" in m["text"])
            assert _processes_with(marker)
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    assert _processes_with(marker) == []
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/tool_call", "tool/tool_result", "system/system"]
    result = rows[2].data
    assert result["is_error"] is True and result["result"] == "Cancelled by the user."
    assert "started" in result["shell_output"]


async def test_cancel_while_waiting_for_approval(script, workspace):
    script([call("w", "write_file", path="x.txt", content="x"), Finish(stop_reason="tool_use")])
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "write")
            waiting = await watcher.until(
                lambda m: m["op"] == "status" and m["status"]["state"] == "waiting"
            )
            assert waiting["status"]["approval"]["call_id"] == "w"
            running = await RunningTurn.objects.aget(tab_id=tab.pk)
            assert running.status == "waiting"
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/tool_call", "tool/tool_result", "system/system"]
    assert rows[2].data["result"] == "Cancelled by the user."
    assert not (workspace / "x.txt").exists()


async def test_approval_runs_the_tool_and_denial_answers_with_an_error(script, workspace):
    script(
        [
            call("w1", "write_file", path="yes.txt", content="y"),
            call("w2", "write_file", path="no.txt", content="n"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "write two")
            for call_id, approved in (("w1", True), ("w2", False)):
                await watcher.until(
                    lambda m, c=call_id: (
                        m["op"] == "status"
                        and (m["status"].get("approval") or {}).get("call_id") == c
                    )
                )
                await database_sync_to_async(turns.approve)(tab.pk, call_id, approved)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    results = [r.data for r in rows if r.type == "tool_result"]
    assert results[0]["is_error"] is False and (workspace / "yes.txt").read_text() == "y"
    assert results[1] == {
        "call_id": "w2",
        "name": "write_file",
        "result": "Denied by the user.",
        "is_error": True,
    }
    assert not (workspace / "no.txt").exists()


async def test_a_mid_turn_message_arrives_after_the_steps_tool_results(script, workspace):
    """Sent while the first step waits for approval; the next request contains it."""
    provider = script(
        [call("w", "write_file", path="a.txt", content="a"), Finish(stop_reason="tool_use")],
        [TextDelta("Saw both."), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "first")
            await watcher.until(lambda m: m["op"] == "status" and m["status"]["state"] == "waiting")
            await submit(tab, "second, mid-turn")
            await submit(tab, "third, mid-turn")
            assert await QueuedMessage.objects.acount() == 2
            await database_sync_to_async(turns.approve)(tab.pk, "w", True)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "tool/tool_result",
        "user/text",
        "user/text",
        "assistant/text",
    ]
    assert [rows[3].data["text"], rows[4].data["text"]] == ["second, mid-turn", "third, mid-turn"]
    last_user = provider.requests[1].messages[-1]
    assert isinstance(last_user.parts[0], ToolResultPart)
    assert [p.text for p in last_user.parts[1:]] == ["second, mid-turn", "third, mid-turn"]
    assert len({r.turn_id for r in rows}) == 1


async def test_a_message_sent_as_the_turn_ends_starts_the_next_turn(script, workspace):
    script(
        [TextDelta("first answer"), *[TextDelta(".")] * 20, Finish()],
        [TextDelta("second answer"), Finish()],
        delay=0.01,
    )
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "one")
            await watcher.until(lambda m: m["op"] == "delta")
            await submit(tab, "two")
            await watcher.until(
                lambda m: m["op"] == "seal" and m["block"]["data"].get("text") == "second answer"
            )
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "user/text", "assistant/text"]
    assert rows[0].turn_id == rows[1].turn_id != rows[2].turn_id == rows[3].turn_id


async def test_a_queued_message_survives_a_restart(script, workspace):
    """Queued with no worker running (a crash before it was taken); the next worker runs it."""
    script([TextDelta("answered after restart"), Finish()])
    tab = await make_tab()
    await submit(tab, "while down")
    assert await QueuedMessage.objects.acount() == 1
    async with Watcher(tab.pk) as watcher, running_worker():
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert [r.data["text"] for r in rows] == ["while down", "answered after restart"]
    assert not await QueuedMessage.objects.aexists()


async def test_two_workers_asked_to_run_the_same_tab_run_it_once(script, workspace):
    provider = script([TextDelta("only once"), Finish()], delay=0.01)
    async with running_worker(count=2):
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hi")
            # A second start request goes to whichever worker is free.
            layer = watcher.layer
            await layer.send(bus.WORKER_CHANNEL, {"type": "turn.start", "tab_id": str(tab.pk)})
            await layer.send(bus.WORKER_CHANNEL, {"type": "turn.start", "tab_id": str(tab.pk)})
            await watcher.until_idle()
            await asyncio.sleep(0.1)
    assert len(provider.requests) == 1
    assert kinds(await chunks(tab.pk)) == ["user/text", "assistant/text"]


async def test_acquire_gives_the_lease_to_one_of_two_threads():
    tab = await make_tab()
    await submit(tab, "hi")
    results = await asyncio.gather(
        database_sync_to_async(lease.acquire, thread_sensitive=False)(tab.pk, "w1"),
        database_sync_to_async(lease.acquire, thread_sensitive=False)(tab.pk, "w2"),
    )
    assert sum(r is not None for r in results) == 1


async def test_checkpoint_writes_are_debounced(script, workspace, monkeypatch):
    """A 3 s stream at 100 deltas/s: one write per sealed chunk, at most ~4 checkpoints a second."""
    writes = {"append": 0, "checkpoint": 0}
    original_append, original_checkpoint = log.append, log.checkpoint

    def counting_append(*args, **kwargs):
        writes["append"] += 1
        return original_append(*args, **kwargs)

    def counting_checkpoint(*args, **kwargs):
        writes["checkpoint"] += 1
        return original_checkpoint(*args, **kwargs)

    monkeypatch.setattr(log, "append", counting_append)
    monkeypatch.setattr(log, "checkpoint", counting_checkpoint)
    script([*[TextDelta("x")] * 300, Finish()], delay=0.01)
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "stream")
    rows = await chunks(tab.pk)
    assert rows[-1].data["text"] == "x" * 300
    # user message + the text chunk
    assert writes["append"] == 2
    # ~3 s of streaming at most one checkpoint per second (max wait) plus idle flushes.
    assert 2 <= writes["checkpoint"] <= 4 * 4


async def test_the_checkpoint_holds_the_open_block_and_is_cleared_on_seal(script, workspace):
    script([*[TextDelta("y")] * 150, Finish()], delay=0.01)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "open" and m["block"]["role"] == "assistant")
            # The debouncer's max wait (1 s) passes while the 1.5 s stream runs: a
            # checkpoint is written before the seal (polled, not slept for).
            checkpointed = None
            answer = Chunk.objects.filter(tab_id=tab.pk, role="assistant")
            while not await answer.aexists():
                checkpointed = await database_sync_to_async(log.checkpointed)(tab.pk)
                if checkpointed is not None:
                    break
                await asyncio.sleep(0.02)
            assert checkpointed is not None, "sealed before any checkpoint"
            assert set(checkpointed.data["text"]) == {"y"}
            await watcher.until_idle()
    assert not await RunningTurn.objects.aexists()
    assert not await CheckpointPiece.objects.aexists()


async def test_recovery_seals_the_checkpoint_as_interrupted(workspace):
    """A turn whose worker died: the checkpoint becomes a chunk, calls get results, a notice."""
    from chat.stream import Block

    tab = await make_tab()
    turn_id = uuid.uuid4()

    def crashed_turn():
        blocks = [
            Block(uuid.uuid4(), turn_id, 0, "user", "text", {"text": "hi"}),
            Block(
                uuid.uuid4(),
                turn_id,
                1,
                "assistant",
                "tool_call",
                {"call_id": "c1", "name": "list_files", "arguments": {}},
            ),
            Block(
                uuid.uuid4(),
                turn_id,
                1,
                "tool",
                "tool_result",
                {"call_id": "c1", "name": "list_files", "result": "a", "is_error": False},
            ),
        ]
        log.append(tab.pk, blocks)
        from django.utils import timezone

        RunningTurn.objects.create(
            tab_id=tab.pk,
            turn_id=turn_id,
            worker="elsewhere:1:x",
            step=2,
            heartbeat_at=timezone.now(),
        )
        log.checkpoint(
            tab.pk,
            Block(uuid.uuid4(), turn_id, 2, "assistant", "text", {"text": "half a sent"}),
            None,
        )
        # The worker died a minute ago: no heartbeat since.
        RunningTurn.objects.update(heartbeat_at=timezone.now() - timezone.timedelta(seconds=60))

    await database_sync_to_async(crashed_turn)()
    recovered = await database_sync_to_async(lease.recover_stale)()
    assert recovered == [tab.pk]
    rows = await chunks(tab.pk)
    assert kinds(rows)[-2:] == ["assistant/text", "system/system"]
    assert rows[-2].data == {"text": "half a sent", "interrupted": True}
    assert rows[-1].data["kind"] == "interrupted"
    assert not await RunningTurn.objects.aexists()


async def test_a_fresh_lease_is_not_recovered():
    tab = await make_tab()
    from django.utils import timezone

    await RunningTurn.objects.acreate(
        tab_id=tab.pk, turn_id=uuid.uuid4(), worker="elsewhere:1:x", heartbeat_at=timezone.now()
    )
    assert await database_sync_to_async(lease.recover_stale)() == []
    assert await RunningTurn.objects.aexists()


async def test_a_response_cut_off_and_retried_is_kept_in_the_log_but_not_sent(
    script, workspace, monkeypatch
):
    """The partial attempt stays visible; the retry and later requests never contain it."""
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01,))
    monkeypatch.setattr(retry, "JITTER", 0)
    dropped = ProviderError("connection dropped", retryable=True)
    provider = script(
        [*think("Plan.", "sig-a"), TextDelta("Partial"), call("lost", "list_files"), dropped],
        [*think("Plan again.", "sig-b"), TextDelta("Full answer."), Finish()],
        [TextDelta("Second turn."), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "first")
        await run_one(tab, "second")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "system/system",
        "assistant/thinking",
        "assistant/text",
        "user/text",
        "assistant/text",
    ]
    assert rows[4].data["retry"] is True and "retrying" in rows[4].data["text"]
    first, again, later = provider.requests
    assert again.messages == first.messages
    replayed = later.messages[1]
    assert replayed.role == "assistant"
    assert [getattr(p, "text", None) for p in replayed.parts] == ["Plan again.", "Full answer."]
    # Usage is recorded for responses that finished: the retry and the second turn.
    assert await UsageRecord.objects.acount() == 2


async def test_a_model_change_during_a_turn_applies_at_the_next_step(script, workspace):
    """Changed while the first step waits for approval: step 2 uses the new model and the
    log says so with a config-reload chunk at that point."""
    first = ScriptedProvider(
        [[call("w", "write_file", path="a.txt", content="a"), Finish(stop_reason="tool_use")]]
    )
    second = ScriptedProvider([[TextDelta("From the new model."), Finish()]])
    script(models={"scripted/first": first, "scripted/second": second})
    async with running_worker():
        tab = await make_tab("scripted/first", approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "status" and m["status"]["state"] == "waiting")
            tab.model = "scripted/second"
            await tab.asave(update_fields=["model"])
            await database_sync_to_async(turns.approve)(tab.pk, "w", True)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "tool/tool_result",
        "system/system",
        "assistant/text",
    ]
    assert rows[3].data["kind"] == "config-reload"
    assert "scripted/first → scripted/second" in rows[3].data["text"]
    assert len(second.requests) == 1


async def test_a_cancel_before_the_stream_starts_stops_the_turn(workspace, monkeypatch):
    """Stop clicked while the provider is still being set up: nothing is streamed."""
    reached, release = asyncio.Event(), asyncio.Event()
    provider = ScriptedProvider([[TextDelta("never shown"), Finish()]])

    async def slow_provider_for(model: str):
        reached.set()
        await release.wait()
        return provider

    monkeypatch.setattr(step, "provider_for", slow_provider_for)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await asyncio.wait_for(reached.wait(), 10)
            await database_sync_to_async(turns.cancel)(tab.pk)
            # The control message reaches the runner while its provider is still
            # being made: wait for it (not for a guessed time).
            while not worker.RUNNING[tab.pk].cancelled.is_set():
                await asyncio.sleep(0.01)
            release.set()
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "system/system"]
    assert rows[-1].data["kind"] == "cancelled"
    assert provider.requests == []


async def test_a_settings_change_during_a_one_step_turn_is_logged_at_its_end(script, workspace):
    script([*[TextDelta("x ")] * 30, Finish()], delay=0.02)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "delta")
            await database_sync_to_async(Setting.objects.create)(key="max_steps", value=7)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[-1].data["kind"] == "config-reload" and "step limit" in rows[-1].data["text"]


async def test_a_stop_meant_for_an_earlier_turn_does_not_stop_this_one(script, workspace):
    script([TextDelta("a"), *[TextDelta(".")] * 30, Finish()], delay=0.01)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "delta")
            stale = uuid.uuid4()
            assert not await database_sync_to_async(turns.cancel)(tab.pk, stale)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text"]


# --- Crashes, stalls and cut answers --------------------------------------------


async def assert_closed_cleanly(tab, watcher) -> None:
    """The turn ended as a turn should: idle sent last, no lease, no 'interrupted'."""
    assert watcher.ops[-1]["op"] == "status" and watcher.ops[-1]["status"]["state"] == "idle"
    assert not await RunningTurn.objects.aexists()
    rows = await chunks(tab.pk)
    assert not [r for r in rows if r.type == "system" and r.data["kind"] == "interrupted"]


async def test_a_crash_in_the_reducer_ends_the_turn_with_an_error_chunk(script, workspace):
    """A delta whose text is not a string breaks the reducer's open block: the turn still
    ends with an error chunk naming the exception, the tab idle and its lease released."""
    script([TextDelta("Partial "), TextDelta(["not", "text"]), Finish()])
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    message = rows[-1].data["message"]
    assert message.startswith("Internal error in the turn runner: TypeError: ")
    sealed = [m["block"]["id"] for m in watcher.ops if m["op"] == "seal"]
    assert sealed[-1] == str(rows[-1].id)
    await assert_closed_cleanly(tab, watcher)


async def test_a_crash_while_a_shell_command_runs_says_it_ran(script, workspace, monkeypatch):
    """The runner breaking during a command: its result keeps what it printed and says
    it was running (so Continue does not tell the model it never ran); the call after
    it was not run."""

    async def breaks_after_output(name, arguments, workspace, *, on_output, **context):
        on_output("half the build\n")
        raise RuntimeError("the tool runner broke")

    monkeypatch.setattr(calls.tools, "run_tool", breaks_after_output)
    script(
        [
            call("a", "shell", command="make"),
            call("b", "shell", command="make install"),
            Finish(stop_reason="tool_use"),
        ]
    )
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "build it", auto_approve=True)
    rows = await chunks(tab.pk)
    ran, never = rows[-3].data, rows[-2].data
    assert (ran["call_id"], ran["result"], ran["shell_output"]) == (
        "a",
        ending.CRASHED_WHILE_RUNNING,
        "half the build\n",
    )
    assert (never["call_id"], never["result"], "shell_output" in never) == (
        "b",
        ending.NOT_RUN_CRASHED,
        False,
    )
    assert ran["interrupted"] and never["interrupted"]
    turn = [r for r in rows if r.turn_id == rows[-1].turn_id]
    message = resume.message(turn)
    assert "`shell: make` was running" in message and "`shell: make install` was not run" in message
    await assert_closed_cleanly(tab, watcher)


async def test_a_crash_answers_every_pending_call(script, workspace, monkeypatch):
    """A tool crashing the runner (not failing as a tool): the call and the one after it
    get results, then the error chunk."""

    async def broken_run_tool(*args, **kwargs):
        raise RuntimeError("the tool runner broke")

    monkeypatch.setattr(calls.tools, "run_tool", broken_run_tool)
    script(
        [call("a", "list_files", path="."), call("b", "list_files"), Finish(stop_reason="tool_use")]
    )
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "list")
    rows = await chunks(tab.pk)
    assert kinds(rows)[-3:] == ["tool/tool_result", "tool/tool_result", "assistant/error"]
    assert [r.data["call_id"] for r in rows[-3:-1]] == ["a", "b"]
    assert all(
        r.data["is_error"] and r.data["result"] == ending.NOT_RUN_CRASHED for r in rows[-3:-1]
    )
    assert rows[-1].data["message"] == (
        "Internal error in the turn runner: RuntimeError: the tool runner broke"
    )
    await assert_closed_cleanly(tab, watcher)


async def test_a_history_that_cannot_be_built_ends_the_turn_with_an_error_chunk(script, workspace):
    """A crash before the steps (a log no request can hold): the message goes into the
    log and an error chunk answers it; idle, the lease released, and no turn restarted."""
    provider = script([TextDelta("never"), Finish()])
    tab = await make_tab()
    from chat.stream import Block

    broken = Block(uuid.uuid4(), None, 0, "tool", "text", {"text": "no such chunk"})
    await database_sync_to_async(log.append)(tab.pk, [broken])
    async with running_worker():
        watcher = await run_one(tab, "hi")
        await asyncio.sleep(0.1)  # a restarted turn would write a second error by now
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["tool/text", "user/text", "assistant/error"]
    assert rows[-1].data["message"] == (
        "Internal error in the turn runner: ValueError: chunk 1: a 'tool' 'text' chunk "
        "cannot be sent"
    )
    assert provider.requests == []
    assert not await QueuedMessage.objects.aexists()
    assert any(m["op"] == "taken" for m in watcher.ops)
    await assert_closed_cleanly(tab, watcher)


async def test_a_channel_layer_that_fails_for_good_still_ends_the_turn(script, workspace):
    """Every publish fails from the first assistant seal on: the error chunk is still in
    the log and the lease is released (recovery would otherwise call it a server stop)."""
    script([TextDelta("Hello"), Finish()])
    tab = await make_tab()
    await submit(tab, "hi")
    turn_id = await database_sync_to_async(lease.acquire)(tab.pk, "elsewhere:1:test")
    published: list[dict] = []
    broken = False

    async def publish(op: dict) -> None:
        nonlocal broken
        if op["op"] == "seal" and op["block"]["role"] == "assistant":
            broken = True
        if broken:
            raise RuntimeError("channel layer down")
        published.append(op)

    await loop.TurnRunner(tab.pk, turn_id, publish).run()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "assistant/error"]
    assert rows[-1].data["message"] == (
        "Internal error in the turn runner: RuntimeError: channel layer down"
    )
    assert not await RunningTurn.objects.aexists()


@pytest.mark.parametrize(
    ("stop_reason", "kind", "text"),
    [
        (
            "max_tokens",
            "output-limit",
            "The model stopped at its output limit: the answer is cut short.",
        ),
        (
            "model_context_window_exceeded",
            "context-limit",
            "The model stopped because the conversation filled its context window.",
        ),
    ],
)
async def test_it_notes_in_the_log_that_a_limit_cut_the_answer(
    script, workspace, stop_reason, kind, text
):
    script([TextDelta("The answer is cut sho"), Finish(Usage(5, 100), stop_reason)])
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "write a lot")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[-1].data == {"kind": kind, "text": text, "stop_reason": stop_reason}
    # Usage of the cut response is kept like any other.
    assert await UsageRecord.objects.acount() == 1


async def test_a_provider_that_stalls_every_time_ends_the_turn_with_a_clear_error(
    script, workspace, monkeypatch
):
    """Silent past the idle timeout on every attempt: each attempt is cut with a retry
    notice, and after the last one an error chunk says what happened."""
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    monkeypatch.setattr(retry, "JITTER", 0)
    never = asyncio.Event()
    provider = ScriptedProvider([[TextDelta("Start"), never]] * 4, idle_timeout=0.2)
    script(models={"scripted/test": provider})
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        *["assistant/text", "system/system"] * 3,
        "assistant/text",
        "assistant/error",
    ]
    notices = [r.data for r in rows if r.type == "system"]
    assert [n["text"] for n in notices] == [
        f"scripted/test sent nothing for 0.2 s; retrying in 0.01 s (attempt {n} of 4)."
        for n in (2, 3, 4)
    ]
    assert all(n["retry"] for n in notices)
    assert rows[-1].data["message"] == (
        "scripted/test sent nothing for 0.2 s, on each of 4 attempts: the provider seems "
        "stalled. Try again later or pick another model."
    )
    assert provider.outcomes == ["closed"] * 4
    await assert_closed_cleanly(tab, watcher)


async def test_a_stalled_attempt_is_retried_and_left_out_of_the_request(
    script, workspace, monkeypatch
):
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01,))
    monkeypatch.setattr(retry, "JITTER", 0)
    provider = ScriptedProvider(
        [[TextDelta("Half"), asyncio.Event()], [TextDelta("Whole."), Finish()]], idle_timeout=0.2
    )
    script(models={"scripted/test": provider})
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system", "assistant/text"]
    assert rows[-1].data["text"] == "Whole."
    first, again = provider.requests
    assert again.messages == first.messages


class _WireProvider:
    """Reads its stream off a socket as an SDK does: any bytes are life (`alive_at`),
    "ping" lines make no event, "done" ends the answer."""

    idle_timeout = 0.3

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.alive_at: float | None = None
        self.started = asyncio.Event()

    async def stream(self, request):
        loop = asyncio.get_running_loop()
        self.started.set()
        while line := await self.reader.readline():
            self.alive_at = loop.time()
            if line == b"done\n":
                yield TextDelta("Done.")
                yield Finish()
                return


async def test_bytes_that_came_while_the_loop_was_blocked_are_not_a_stall(script, workspace):
    """The loop blocked past the idle timeout while a ping sat unread: the watchdog's
    timer runs before the task that reads it, so it looks again before cutting."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=theirs)
    provider = _WireProvider(reader)
    script(models={"scripted/test": provider})
    try:
        async with running_worker():
            tab = await make_tab()
            async with Watcher(tab.pk) as watcher:
                await submit(tab, "hi")
                await provider.started.wait()
                await asyncio.sleep(0.05)  # the provider waits on the socket
                ours.sendall(b"ping\n")
                time.sleep(provider.idle_timeout * 1.5)  # blocks the loop: nothing reads
                await asyncio.sleep(0.15)
                ours.sendall(b"done\n")
                await watcher.until_idle()
    finally:
        ours.close()
        writer.close()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text"]
    assert rows[-1].data["text"] == "Done."


async def test_the_status_says_since_when_the_model_has_been_silent(script, workspace, monkeypatch):
    """Silent past WAITING_STATUS_AFTER: a status with `waiting_since` goes out; the next
    event clears it."""
    monkeypatch.setattr(step, "WAITING_STATUS_AFTER", 0.05)
    gate = asyncio.Event()
    script([TextDelta("a"), gate, TextDelta("b"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hi")
            waiting = await watcher.until(
                lambda m: m["op"] == "status" and m["status"].get("waiting_since")
            )
            gate.set()
            resumed = await watcher.until(lambda m: m["op"] == "status")
            await watcher.until_idle()
    since = waiting["status"]["waiting_since"]
    assert since >= waiting["status"]["started_at"]
    assert resumed["status"]["state"] == "running" and resumed["status"]["waiting_since"] is None
    assert [r.data.get("text") for r in await chunks(tab.pk)] == ["hi", "ab"]
    # The status line counts from it (the page's clock ticks the same element).
    line = render.fragment_status(waiting["status"])
    assert 'class="sep waiting" data-since="' in line
    assert "waiting for the model · " in line
    assert "waiting for the model" not in render.fragment_status(resumed["status"])


async def test_a_crash_escaping_the_runner_is_ended_by_the_worker(script, workspace, monkeypatch):
    """Whatever escapes run() itself: the worker still ends the turn with an error chunk,
    idle and a released lease, instead of only logging it."""

    async def broken_run(self):
        raise RuntimeError("run() broke")

    monkeypatch.setattr(loop.TurnRunner, "run", broken_run)
    async with running_worker():
        tab = await make_tab()
        watcher = await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert (
        rows[-1].data["message"] == "Internal error in the turn runner: RuntimeError: run() broke"
    )
    await assert_closed_cleanly(tab, watcher)


async def test_a_crash_message_is_capped(script, workspace):
    """An exception with a huge text (a repr of a big object) is quoted up to a bound."""

    class Huge:
        def __repr__(self) -> str:
            return "x" * 50_000

    script([Huge()])
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "hi")
    message = (await chunks(tab.pk))[-1].data["message"]
    prefix = "Internal error in the turn runner: TypeError: "
    assert message.startswith(prefix + "not a provider event: xxx")
    assert len(message) == len(prefix) + loop.CRASH_MESSAGE_CHARS and message.endswith("…")


async def test_a_message_queued_inside_a_callers_transaction_asks_for_a_run_once_it_commits(
    monkeypatch,
):
    """A wake fires inside its own transaction: a worker asked before the commit would find
    no message (and after a rollback there is none to run)."""
    tab = await make_tab()
    asked: list[tuple[uuid.UUID, bool]] = []
    monkeypatch.setattr(
        bus, "request_run", lambda tab_id, auto_approve=False: asked.append((tab_id, auto_approve))
    )

    def fire(fail: bool) -> list:
        try:
            with transaction.atomic():
                turns.submit(tab, "from a wake")
                seen = list(asked)
                if fail:
                    raise RuntimeError("the firing failed after the submit")
        except RuntimeError:
            pass
        return seen

    assert await database_sync_to_async(fire)(True) == []
    assert asked == []
    assert await database_sync_to_async(fire)(False) == []
    assert asked == [(tab.pk, False)]
