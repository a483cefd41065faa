"""Compaction and elision end to end (ARCHITECTURE.md, Context management): the real turn
runner and the official Anthropic SDK against the fake server, which reports usage as the
API does. The summary request must be the live request plus one message (a cache read of the
whole conversation); compaction happens at turn boundaries, or before the turn that
overflows, which stays verbatim; every failure leaves the log valid and says why."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import context, turns
from chat.follow import SseRenderer
from chat.models import QueuedMessage, Tab, UsageRecord
from chat.turn import lease
from harness.fakeprovider import STALL, Pause, Reply
from tests.anthropic_wire import (
    MODEL,
    Body,
    assert_same_prefix,
    reply,
    settled,
    text,
    thinking,
    tool_use,
    use_anthropic,
)
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SUMMARY = "The user asked about notes.txt; it says hello."
# Usage that puts a 200k-window model past COMPACT_AT (75%), and past OVERFLOW_AT (90%).
NEAR_FULL = {"input_tokens": 2_000, "cache_read_input_tokens": 158_000}
OVERFULL = {"input_tokens": 2_000, "cache_read_input_tokens": 182_000}


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello from notes\n")
    return workspace


async def run_one(tab: Tab, message: str) -> list[dict]:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, message)
        await watcher.until_idle()
    await settled(tab.pk)
    return watcher.ops


async def compact(tab: Tab, **kwargs) -> list[dict]:
    async with Watcher(tab.pk) as watcher:
        await database_sync_to_async(turns.compact)(tab, **kwargs)
        await watcher.until_idle()
    await settled(tab.pk)
    return watcher.ops


def body(fake_server, index: int) -> Body:
    return Body.of(fake_server.requests[index].body)


async def records(tab: Tab) -> list[tuple[str, int]]:
    return [
        (r.kind, r.step) async for r in UsageRecord.objects.filter(tab_id=tab.pk).order_by("id")
    ]


async def first_turn(fake_server, tab: Tab, *, usage=None) -> None:
    """A turn of two steps: signed thinking and a tool call, then the answer."""
    fake_server.add(
        reply(
            thinking("Read it first.", "sig-1"),
            tool_use("toolu_read", "read_file", path="notes.txt"),
            stop="tool_use",
        ),
        reply(text("notes.txt says hello."), usage=usage),
    )
    await run_one(tab, "What does notes.txt say?")


async def test_compact_sends_the_live_request_plus_one_message_and_the_next_starts_from_it(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab)
        fake_server.add(reply(text(SUMMARY)))
        ops = await compact(tab, instructions="the file's contents")
        fake_server.add(reply(text("Yes.")))
        await run_one(tab, "Anything else?")
    assert len(fake_server.requests) == 4
    live, summary, after = body(fake_server, 1), body(fake_server, 2), body(fake_server, 3)
    # Byte for byte the last request of the turn (model, system, thinking, tools, every
    # block), then the answer that ended it, then the question.
    assert_same_prefix(fake_server.requests[1].body, fake_server.requests[2].body, blocks=4)
    asked = summary.blocks[len(live.blocks) :]
    assert asked[0] == {"type": "text", "text": "notes.txt says hello."}
    assert asked[1]["type"] == "text" and asked[1]["text"].startswith(context.ASK)
    assert asked[1]["text"].endswith("Focus the summary on: the file's contents")
    assert len(asked) == 2
    # The next request: the summary and the new message, nothing of before.
    assert after.head == live.head and after.tail == live.tail
    assert after.blocks == [
        {"type": "text", "text": context.summary_message(SUMMARY)},
        {"type": "text", "text": "Anything else?"},
    ]
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/text",
        "system/compaction",
        "user/text",
        "assistant/text",
    ]
    data = rows[5].data
    assert data["summary"] == SUMMARY and data["through_seq"] == 5
    assert (data["trigger"], data["model"], data["instructions"]) == (
        "manual",
        MODEL,
        "the file's contents",
    )
    assert await records(tab) == [("step", 1), ("step", 2), ("summary", 0), ("step", 1)]
    states = [op["status"]["state"] for op in ops if op["op"] == "status"]
    assert "compacting" in states and states[-1] == "idle"
    # The log, the page and search keep everything: only the request starts later.
    assert rows[0].data["text"] == "What does notes.txt say?"


async def test_a_turn_starting_past_the_threshold_is_compacted_first(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab, usage=NEAR_FULL)
        await tab.arefresh_from_db()
        size = context.Size.from_dict(tab.context)
        assert (size.prompt, size.cache_read, size.estimated) == (160_000, 158_000, False)
        fake_server.add(reply(text(SUMMARY)), reply(text("Sure.")))
        await run_one(tab, "Next question")
    assert len(fake_server.requests) == 4
    assert_same_prefix(fake_server.requests[1].body, fake_server.requests[2].body, blocks=4)
    assert body(fake_server, 3).blocks == [
        {"type": "text", "text": context.summary_message(SUMMARY)},
        {"type": "text", "text": "Next question"},
    ]
    rows = await chunks(tab.pk)
    assert kinds(rows)[5:] == ["system/compaction", "user/text", "assistant/text"]
    assert rows[5].data["trigger"] == "auto" and rows[5].data["tokens_before"] == 160_020
    # The compaction belongs to the turn it was made for.
    assert rows[5].turn_id == rows[6].turn_id
    await tab.arefresh_from_db()
    assert tab.context["input"] == 50 and not tab.context["estimated"]


@pytest.mark.parametrize("trigger", ["usage", "refused"])
async def test_a_turn_that_overflows_keeps_itself_verbatim(
    fake_server, monkeypatch, workspace, trigger
):
    """Mid-turn: past OVERFLOW_AT after a step, or refused by the provider as too long,
    everything before the turn is summarised and the turn goes on whole (its signed
    thinking and tool chain intact)."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        fake_server.add(reply(text("Hi.")))
        await run_one(tab, "Hello")
        step1 = reply(
            thinking("Look at it.", "sig-2"),
            tool_use("toolu_read", "read_file", path="notes.txt"),
            stop="tool_use",
            usage=OVERFULL if trigger == "usage" else None,
        )
        fake_server.add(step1)
        if trigger == "refused":
            fake_server.add(
                Reply.error(400, "invalid_request_error", "prompt is too long: 201000 tokens")
            )
        fake_server.add(reply(text(SUMMARY)), reply(text("It says hello.")))
        await run_one(tab, "Read notes.txt")
    requests = fake_server.requests
    asked_at = 3 if trigger == "refused" else 2
    assert len(requests) == asked_at + 2
    # The live request does not fit: the summary request is the log before the turn
    # (the first turn's request, its answer, the question), smaller than what was refused.
    summary = body(fake_server, asked_at)
    assert_same_prefix(requests[0].body, requests[asked_at].body, blocks=1)
    assert summary.blocks[1:] == [
        {"type": "text", "text": "Hi."},
        {"type": "text", "text": context.ask()},
    ]
    assert b"Read notes.txt" not in requests[asked_at].body
    retried = body(fake_server, asked_at + 1)
    assert retried.blocks == [
        {"type": "text", "text": context.summary_message(SUMMARY)},
        {"type": "text", "text": "Read notes.txt"},
        {"type": "thinking", "thinking": "Look at it.", "signature": "sig-2"},
        {
            "type": "tool_use",
            "id": "toolu_read",
            "name": "read_file",
            "input": {"path": "notes.txt"},
        },
        retried.blocks[4],
    ]
    assert retried.blocks[4]["type"] == "tool_result"
    rows = await chunks(tab.pk)
    assert kinds(rows)[2:] == [
        "user/text",
        "assistant/thinking",
        "assistant/tool_call",
        "tool/tool_result",
        "system/compaction",
        "assistant/text",
    ]
    assert rows[6].data["through_seq"] == 2
    assert all(r.type != "error" for r in rows)


async def test_a_first_turn_too_big_on_its_own_says_so_and_ends_with_the_error(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    fake_server.add(Reply.error(400, "invalid_request_error", "prompt is too long: 300000 tokens"))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "A huge paste")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "system/system", "assistant/error"]
    assert rows[1].data["kind"] == "compaction-failed"
    assert "nothing before it left to summarise" in rows[1].data["text"]
    assert "prompt is too long" in rows[2].data["message"]
    assert len(fake_server.requests) == 1  # not asked again for nothing


def summary_tool_call() -> Reply:
    return reply(tool_use("toolu_x", "shell", command="ls"), stop="tool_use")


@pytest.mark.parametrize(
    ("replies", "why", "requests"),
    [
        ([reply(text("   "))], "the summary came back empty", 1),
        ([reply(text("Half a summ"), stop="max_tokens")], "cut off at the model's output limit", 1),
        ([summary_tool_call(), summary_tool_call()], "called a tool instead", 2),
        ([Reply.error(400, "invalid_request_error", "bad request")], "Could not compact", 1),
        (
            [
                Reply.error(529, "overloaded_error", "Overloaded"),
                Reply.error(529, "overloaded_error", "Overloaded"),
            ],
            "Could not compact",
            2,
        ),
    ],
    ids=["empty", "output-limit", "tool-call-twice", "error", "overloaded-twice"],
)
async def test_a_failed_summary_leaves_the_log_valid_and_says_why(
    fake_server, monkeypatch, workspace, replies, why, requests
):
    use_anthropic(monkeypatch, fake_server)
    monkeypatch.setattr("chat.retry.RETRY_DELAYS", (0.01,))
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab)
        fake_server.add(*replies)
        await compact(tab)
        fake_server.add(reply(text("Yes.")))
        await run_one(tab, "Go on")
    assert len(fake_server.requests) == 2 + requests + 1
    rows = await chunks(tab.pk)
    assert kinds(rows)[5:] == ["system/system", "user/text", "assistant/text"]
    assert rows[5].data["kind"] == "compaction-failed"
    assert why in rows[5].data["text"] and "goes on uncompacted" in rows[5].data["text"]
    # Nothing was compacted: the next request is the whole conversation.
    assert body(fake_server, 2 + requests).blocks[0]["text"] == "What does notes.txt say?"


async def test_a_stray_tool_call_is_ignored_and_the_summary_asked_again(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab)
        fake_server.add(summary_tool_call(), reply(text(SUMMARY)))
        await compact(tab)
    assert fake_server.requests[3].body == fake_server.requests[2].body
    rows = await chunks(tab.pk)
    assert kinds(rows)[5:] == ["system/compaction"]
    assert await records(tab) == [("step", 1), ("step", 2), ("summary", 0), ("summary", 0)]


async def test_a_compaction_asked_for_during_a_turn_waits_for_its_end(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        fake_server.add(reply(text("Hi.")))
        await run_one(tab, "Hello")
        fake_server.add(
            Reply(
                events=[
                    *reply(text("Slow answer.")).events[:2],
                    Pause(0.5),
                    *reply(text("Slow answer.")).events[2:],
                ]
            )
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "Second")
            await watcher.until(lambda m: m["op"] == "open")
            queued = await database_sync_to_async(turns.compact)(tab, through=2)
            status = await database_sync_to_async(lease.status)(tab.pk)
            assert status["queued"] == [{"id": queued.pk, "text": queued.label, "compact": True}]
            assert "through chunk 2" in queued.label
            fake_server.add(reply(text(SUMMARY)))
            await watcher.until_idle()
            await watcher.until(lambda m: m["op"] == "taken" and m["ids"] == [queued.pk])
            await watcher.until_idle()
        await settled(tab.pk)
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/text",
        "user/text",
        "assistant/text",
        "system/compaction",
    ]
    # "Up to here" at chunk 2 is the end of its turn: the second turn stays verbatim,
    # and the model was told where the summary stops.
    assert rows[4].data["through_seq"] == 2
    assert 'begins "Second"' in body(fake_server, 2).blocks[-1]["text"]
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()


@pytest.mark.parametrize(
    ("through", "error"),
    [(0, "no chunk 0"), (99, "no chunk 99"), (2**70, "no chunk")],
)
async def test_compact_refuses_a_chunk_that_does_not_exist(
    fake_server, monkeypatch, through, error
):
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        with pytest.raises(ValueError, match="no messages"):
            await database_sync_to_async(turns.compact)(tab)
        fake_server.add(reply(text("Hi.")))
        await run_one(tab, "Hello")
        with pytest.raises(ValueError, match=error):
            await database_sync_to_async(turns.compact)(tab, through=through)
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()


async def test_a_second_compaction_waiting_is_refused(fake_server, monkeypatch, workspace):
    use_anthropic(monkeypatch, fake_server)
    fake_server.add(reply(text("Hi.", stop=False), stop=None, then=[STALL]))
    async with running_worker():
        tab = await make_tab(MODEL)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "Hello")
            await watcher.until(lambda m: m["op"] == "open")
            await database_sync_to_async(turns.compact)(tab)
            with pytest.raises(ValueError, match="already waiting"):
                await database_sync_to_async(turns.compact)(tab)
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    assert await QueuedMessage.objects.filter(tab_id=tab.pk, compact=True).acount() <= 1


async def test_old_bulky_results_are_elided_when_the_cache_is_cold(
    fake_server, monkeypatch, workspace
):
    """Three turns, the first reading a big file; after a pause past the cache's life,
    the next turn starts with an elide chunk and the old output goes as a sentinel."""
    use_anthropic(monkeypatch, fake_server)
    big = "data " * 5_000
    (workspace / "big.txt").write_text(big)
    async with running_worker():
        tab = await make_tab(MODEL)
        fake_server.add(
            reply(tool_use("toolu_big", "read_file", path="big.txt"), stop="tool_use"),
            reply(text("Read.")),
            reply(text("Two.")),
            reply(text("Three.")),
        )
        for question in ("Read big.txt", "Second", "Third"):
            await run_one(tab, question)
        # A pause past the cache's lifetime, at a size past COMPACT_TO of the window.
        stale = timezone.now() - timedelta(seconds=context.CACHE_LIFETIME + 60)
        size = context.Size(input=60_000, at=stale.isoformat())
        await Tab.objects.filter(pk=tab.pk).aupdate(context=size.as_dict())
        fake_server.add(reply(text("Four.")))
        await run_one(tab, "Fourth")
    rows = await chunks(tab.pk)
    elide = next(r for r in rows if r.data.get("kind") == context.ELIDE)
    result = next(r for r in rows if r.type == "tool_result")
    assert elide.data["seqs"] == [result.seq]
    assert rows[rows.index(elide) + 1].data["text"] == "Fourth"
    sent = body(fake_server, 4)
    sentinel = context.sentinel("read_file", len(result.data["result"]))
    assert {"type": "tool_result", "tool_use_id": "toolu_big", "content": sentinel} in sent.blocks
    # Not elided before: the warm requests kept the output.
    assert big[:100] in fake_server.requests[3].body.decode()


async def test_a_model_the_registry_does_not_know_gets_a_conservative_window(fake_server):
    tab = await make_tab("openai/some-local-model")
    meter = await database_sync_to_async(lease.meter)(tab.pk)
    assert meter["window"] == context.UNKNOWN_WINDOW and meter["window_known"] is False
    assert meter["used"] == 0


async def test_a_turn_cut_short_can_be_continued_after_a_compaction(
    fake_server, monkeypatch, workspace
):
    """Compacting after an error, then Continue: the compaction's turn of notices alone
    is not the turn Continue looks at."""
    use_anthropic(monkeypatch, fake_server)
    fake_server.add(Reply.error(400, "invalid_request_error", "bad request"))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "Hello")
        fake_server.add(reply(text(SUMMARY)))
        await compact(tab)
        assert kinds(await chunks(tab.pk)) == ["user/text", "assistant/error", "system/compaction"]
        queued = await database_sync_to_async(turns.continue_turn)(tab)
        assert "error" in queued.text.lower()
        await database_sync_to_async(QueuedMessage.objects.filter(pk=queued.pk).delete)()


async def test_the_event_stream_does_not_end_a_turn_that_is_compacting():
    """SSE clients see turn-done once, at idle: not when the status says compacting."""
    renderer = SseRenderer()
    renderer.bind(type("F", (), {"position": lambda self: "0"})())
    events = [
        renderer.status({"state": state, "turn_id": "t1"})
        for state in ("running", "compacting", "running", "idle")
    ]
    assert ["turn-done" in e for e in events] == [False, False, False, True]


async def test_a_summary_refused_for_the_window_is_asked_again_with_less_room_to_answer(
    fake_server, monkeypatch, workspace
):
    """Some models count input + max_tokens against the window: the summary is asked
    again, the same messages with a small output limit."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab)
        fake_server.add(
            Reply.error(
                400,
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 180000 + 64000 > 200000",
            ),
            reply(text(SUMMARY)),
        )
        await compact(tab)
    first, second = fake_server.requests[2].json, fake_server.requests[3].json
    assert first["max_tokens"] == 64_000
    assert second["max_tokens"] == context.SUMMARY_MAX_TOKENS
    assert first["messages"] == second["messages"] and first["thinking"] == second["thinking"]
    assert kinds(await chunks(tab.pk))[-1] == "system/compaction"


async def test_stop_while_compacting_at_a_turn_start_stops_that_turn(
    fake_server, monkeypatch, workspace
):
    """The message that started the turn goes into the log before the cancelled notice;
    it does not start another turn (which would compact and answer after a Stop)."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        tab = await make_tab(MODEL)
        await first_turn(fake_server, tab, usage=NEAR_FULL)
        fake_server.add(reply(text("Half a summ", stop=False), stop=None, then=[STALL]))
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "Next question")
            await watcher.until(
                lambda m: m["op"] == "status" and m["status"]["state"] == "compacting"
            )
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
        await settled(tab.pk)
    rows = await chunks(tab.pk)
    assert kinds(rows)[5:] == ["user/text", "system/system"]
    assert rows[5].data["text"] == "Next question" and rows[6].data["kind"] == "cancelled"
    # No turn after the Stop: nothing asked past the summary (recorded once its
    # connection closed, so it may not be in the list yet).
    assert len(fake_server.requests) <= 3
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()
