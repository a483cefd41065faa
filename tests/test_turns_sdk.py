"""Full turns through the real SDKs against the fake provider server (recorded wire data)."""

# ruff: noqa: F811
from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async

from chat.models import UsageRecord
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit
from tests.fakeprovider import Reply, fake_server, fake_server_factory, recorded  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

DERIVED = "derived/"
RECORDED = "recorded-streams/"


@pytest.fixture
def workspace(tmp_path, settings):
    settings.DISPATCH_WORKSPACE = tmp_path
    return tmp_path


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
