"""Full turns through the real SDKs against the fake provider server (recorded wire data)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import retry
from chat.models import RunningTurn, UsageRecord
from chat.turn import step
from harness.fakeprovider import STALL, Pause, Reply, recorded
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

DERIVED = "derived/"
RECORDED = "recorded-streams/"


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


def strip_cache_control(value):
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


async def run_one(tab, text: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()


async def test_anthropic_multi_step_turn_with_interleaved_thinking(
    fake_server, monkeypatch, workspace
):
    """Thinking, text, a tool call (to a tool that does not exist: an error result), then a
    second step with thinking and redacted thinking; signatures go back byte for byte."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    fake_server.add(
        Reply(events=recorded(DERIVED + "anthropic-interleaved-thinking.1.chunks.txt")),
        Reply(events=recorded(DERIVED + "anthropic-interleaved-thinking.2.chunks.txt")),
    )
    async with running_worker():
        tab = await make_tab("anthropic/claude-sonnet-4-5")
        await run_one(tab, "What's the weather in San Francisco?")
    rows = await chunks(tab.pk)
    assert kinds(rows)[:5] == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
    ]
    assert rows[3].data["name"] == "weather"
    assert rows[3].data["arguments"] == {"unit": "c", "location": "San Francisco"}
    assert rows[4].data["is_error"] is True and "weather" in rows[4].data["result"]
    assert kinds(rows)[5:] and all(k.startswith("assistant/") for k in kinds(rows)[5:])
    assert any(r.type == "thinking" and r.data.get("redacted_data") for r in rows[5:])
    # The second request replays the first step's thinking exactly and answers its call.
    first_signature = rows[1].data["signature"]
    second = fake_server.requests[1].json
    assistant = second["messages"][1]
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": rows[1].data["text"],
        "signature": first_signature,
    }
    result = second["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01WeatherSF"
    assert result["is_error"] is True
    # The first request's messages come back unchanged (cache markers aside) in the second.
    before = strip_cache_control(fake_server.requests[0].json["messages"])
    after = strip_cache_control(second["messages"])
    assert json.dumps(after[: len(before)]) == json.dumps(before)
    usage = await database_sync_to_async(list)(UsageRecord.objects.order_by("step"))
    assert [u.step for u in usage] == [1, 2]
    assert usage[0].cache_write_tokens == 1800


async def test_openai_parallel_tool_calls_then_an_answer(fake_server, monkeypatch, workspace):
    """Two calls by index with fragments (one repeating id and name); both answered in order."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
    fake_server.add(
        Reply(events=recorded(DERIVED + "openai-parallel-tools.chunks.txt")),
        Reply(events=recorded(RECORDED + "openai-compatible__azure-text.chunks.txt")),
    )
    async with running_worker():
        tab = await make_tab("openai/gpt-4.1")
        await run_one(tab, "Weather in two cities?")
    rows = await chunks(tab.pk)
    calls = [r for r in rows if r.type == "tool_call"]
    results = [r for r in rows if r.type == "tool_result"]
    assert len(calls) == 2 and [r.data["call_id"] for r in results] == [
        c.data["call_id"] for c in calls
    ]
    assert kinds(rows)[-1] == "assistant/text"
    second = fake_server.requests[1].json["messages"]
    tool_messages = [m for m in second if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c.data["call_id"] for c in calls]


async def test_a_provider_error_through_the_sdk_becomes_an_error_chunk(
    fake_server, monkeypatch, workspace
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "bad-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    fake_server.add(Reply.error(401, "authentication_error", "invalid x-api-key"))
    async with running_worker():
        tab = await make_tab("anthropic/claude-sonnet-4-5")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert rows[-1].data["status_code"] == 401
    assert "invalid x-api-key" in rows[-1].data["message"]


# --- Unusual but valid streams, stalls and cut answers ---------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "magistral-medium",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


USAGE = {"usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}}


def use_openai(monkeypatch, server) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)


def use_anthropic(monkeypatch, server) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)


async def assert_ended_cleanly(tab) -> None:
    assert not await RunningTurn.objects.aexists()
    rows = await chunks(tab.pk)
    assert not [r for r in rows if r.type == "system" and r.data["kind"] == "interrupted"]


async def test_content_as_typed_parts_becomes_thinking_and_text(
    fake_server, monkeypatch, workspace
):
    """Mistral's list-typed content: a thinking chunk, a text chunk and the usage."""
    use_openai(monkeypatch, fake_server)
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "Short answer."}]}
    fake_server.add(
        Reply(
            events=[
                chunk({"role": "assistant", "content": [thinking]}),
                chunk({"content": [{"type": "text", "text": "Hello!"}]}, finish="stop"),
                {**chunk({}), "choices": [], **USAGE},
            ]
        )
    )
    async with running_worker():
        tab = await make_tab("openai/magistral-medium")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/thinking", "assistant/text"]
    assert rows[1].data["text"] == "Short answer." and rows[2].data["text"] == "Hello!"
    usage = await UsageRecord.objects.aget()
    assert (usage.input_tokens, usage.output_tokens) == (20, 7)
    await assert_ended_cleanly(tab)


async def test_a_content_part_of_an_unknown_type_is_an_error_chunk_naming_the_field(
    fake_server, monkeypatch, workspace
):
    use_openai(monkeypatch, fake_server)
    fake_server.add(
        Reply(
            events=[
                chunk({"role": "assistant", "content": "Per the docs"}),
                chunk({"content": [{"type": "reference", "reference_ids": [3]}]}),
                chunk({}, finish="stop"),
            ]
        )
    )
    async with running_worker():
        tab = await make_tab("openai/magistral-medium")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "assistant/error"]
    message = rows[-1].data["message"]
    assert message.startswith("OpenAI-compatible server stream: unexpected ")
    assert "`choices[0].delta.content[0]` of type dict" in message
    assert len(fake_server.requests) == 1  # not retried: the server would say it again
    await assert_ended_cleanly(tab)


def message_start(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 30, "output_tokens": 1},
        },
    }


def message_end(stop_reason: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 12},
        },
        {"type": "message_stop"},
    ]


def text_block(index: int, text: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text"}},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
        {"type": "content_block_stop", "index": index},
    ]


async def test_content_prefilled_in_message_start_is_logged_and_its_call_runs(
    fake_server, monkeypatch, workspace
):
    """Text and a tool_use that came whole in message_start are chunks like streamed
    ones; the call runs and the next step answers it."""
    use_anthropic(monkeypatch, fake_server)
    (workspace / "notes.txt").write_text("x")
    prefilled = [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_pre", "name": "list_files", "input": {"path": "."}},
    ]
    fake_server.add(
        Reply(events=[message_start(prefilled), *message_end("tool_use")]),
        Reply(
            events=[
                message_start([]),
                *text_block(0, "There is notes.txt."),
                *message_end("end_turn"),
            ]
        ),
    )
    async with running_worker():
        tab = await make_tab("anthropic/claude-haiku-4-5")
        await run_one(tab, "what is here?")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/text",
    ]
    assert rows[1].data["text"] == "Let me look."
    assert rows[2].data["call_id"] == "toolu_pre" and "notes.txt" in rows[3].data["result"]
    result = fake_server.requests[1].json["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_pre"


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_an_answer_cut_at_the_output_limit_is_followed_by_a_notice(
    fake_server, monkeypatch, workspace, wire
):
    """stop_reason max_tokens (Anthropic) and finish_reason length (OpenAI): the text
    stays and a system notice says the answer is cut short."""
    if wire == "anthropic":
        use_anthropic(monkeypatch, fake_server)
        model = "anthropic/claude-haiku-4-5"
        events = [message_start([]), *text_block(0, "It all began"), *message_end("max_tokens")]
    else:
        use_openai(monkeypatch, fake_server)
        model = "openai/gpt-4.1"
        events = [chunk({"content": "It all began"}, finish="length")]
    fake_server.add(Reply(events=events))
    async with running_worker():
        tab = await make_tab(model)
        await run_one(tab, "tell me everything")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[-1].data["kind"] == "output-limit"
    assert rows[-1].data["text"] == (
        "The model stopped at its output limit: the answer is cut short."
    )


async def test_a_stalling_server_is_retried_then_reported(fake_server, monkeypatch, workspace):
    """A server that goes silent mid-answer on every attempt: each attempt is cut after
    the endpoint's idle timeout (the connection closed), retried with a notice, and the
    turn ends with an error saying the provider stalled."""
    use_openai(monkeypatch, fake_server)
    # Long enough that a loaded machine's connect and request never count as the stall.
    monkeypatch.setenv("OPENAI_STREAM_IDLE_TIMEOUT", "0.8")
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    monkeypatch.setattr(retry, "JITTER", 0)
    for _ in range(4):
        fake_server.add(Reply(events=[chunk({"content": "Once upon"}), STALL]))
    async with running_worker():
        tab = await make_tab("openai/gpt-4.1")
        await run_one(tab, "a story")
    rows = await chunks(tab.pk)
    notices = [r.data["text"] for r in rows if r.type == "system"]
    assert notices == [
        f"openai/gpt-4.1 sent nothing for 0.8 s; retrying in 0.01 s (attempt {n} of 4)."
        for n in (2, 3, 4)
    ]
    assert kinds(rows)[-1] == "assistant/error"
    assert "sent nothing for 0.8 s, on each of 4 attempts" in rows[-1].data["message"]
    assert len(fake_server.requests) == 4
    for request in fake_server.requests:
        assert await asyncio.to_thread(request.wait_disconnected)
    await assert_ended_cleanly(tab)


async def test_pings_keep_a_silent_stream_alive(fake_server, monkeypatch, workspace):
    """Pings (which the SDK drops before any event) are life: a model thinking silently
    for longer than the idle timeout is not cut off."""
    use_anthropic(monkeypatch, fake_server)
    monkeypatch.setenv("ANTHROPIC_STREAM_IDLE_TIMEOUT", "0.5")
    pings = [item for _ in range(20) for item in (Pause(0.05), {"type": "ping"})]
    fake_server.add(
        Reply(events=[message_start([]), *pings, *text_block(0, "Done."), *message_end("end_turn")])
    )
    async with running_worker():
        tab = await make_tab("anthropic/claude-haiku-4-5")
        await run_one(tab, "think hard")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text"]
    assert len(fake_server.requests) == 1


async def test_a_server_that_only_pings_is_cut_off_within_a_bound(
    fake_server, monkeypatch, workspace
):
    """Pings are life, but not forever: with no event for STREAM_SILENT_MAX the attempt
    is given up like a stall, so a turn always ends within a bounded total."""
    use_anthropic(monkeypatch, fake_server)
    # Pings 20 times the idle timeout apart: a busy machine (the suite runs in three
    # processes) must not turn a late ping into "sent nothing".
    monkeypatch.setenv("ANTHROPIC_STREAM_IDLE_TIMEOUT", "1.0")
    monkeypatch.setattr(step, "STREAM_SILENT_MAX", 2.0)
    monkeypatch.setattr(retry, "RETRY_DELAYS", ())
    monkeypatch.setattr(retry, "JITTER", 0)
    pings = [item for _ in range(200) for item in (Pause(0.05), {"type": "ping"})]
    fake_server.add(Reply(events=[message_start([]), *pings, *message_end("end_turn")]))
    async with running_worker():
        tab = await make_tab("anthropic/claude-haiku-4-5")
        await run_one(tab, "think forever")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert rows[-1].data["message"].startswith("anthropic/claude-haiku-4-5 sent only keep-alives")
    assert await asyncio.to_thread(fake_server.requests[0].wait_disconnected)
    await assert_ended_cleanly(tab)


async def test_a_bad_idle_timeout_setting_is_an_error_naming_the_variable(
    fake_server, monkeypatch, workspace
):
    use_openai(monkeypatch, fake_server)
    monkeypatch.setenv("OPENAI_STREAM_IDLE_TIMEOUT", "soon")
    async with running_worker():
        tab = await make_tab("openai/gpt-4.1")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert rows[-1].data["message"].startswith("OPENAI_STREAM_IDLE_TIMEOUT='soon' is not a number")
    assert fake_server.requests == []
