"""The Anthropic adapter against the fake server, through the real SDK."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from chat.history import History
from chat.providers.anthropic import AnthropicProvider, build_params
from chat.providers.base import (
    Finish,
    Message,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    Request,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCallEvent,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
    Usage,
)
from chat.providers.registry import INTERLEAVED_THINKING_BETA, model_info
from chat.stream import Block, Reducer, Seal
from harness.fakeprovider import (
    CUT,
    FakeProviderServer,
    Pause,
    Raw,
    Reply,
    collect,
    recorded,
)

# Generous for a local server, short enough that a hang fails fast.
TIMEOUT = 5.0
SONNET_45 = "anthropic/claude-sonnet-4-5"

TEXT = "recorded-streams/anthropic__anthropic-text.chunks.txt"
SIGNATURE_ONLY = (
    "recorded-streams/anthropic__anthropic-claude-sonnet-5-reasoning-generic.chunks.txt"
)
JSON_TOOL = "recorded-streams/anthropic__anthropic-json-tool.1.chunks.txt"
NO_ARGS = "recorded-streams/anthropic__anthropic-tool-no-args.chunks.txt"
WEB_SEARCH = "recorded-streams/anthropic__anthropic-web-search-with-tool.1.chunks.txt"
INTERLEAVED_1 = "derived/anthropic-interleaved-thinking.1.chunks.txt"
INTERLEAVED_2 = "derived/anthropic-interleaved-thinking.2.chunks.txt"
PARALLEL = "derived/anthropic-parallel-tools.chunks.txt"

TOOLS = (
    ToolSpec(
        "weather",
        "The weather in a city.",
        {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    ),
    ToolSpec("list_files", "List the workspace.", {"type": "object", "properties": {}}),
)
SYSTEM = "You are a careful assistant."


def provider(server: FakeProviderServer, model: str = SONNET_45, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(
        model_info(model),
        api_key="test-key",
        base_url=server.url,
        timeout=kw.pop("timeout", TIMEOUT),
    )


def ask(text: str = "Hello") -> Request:
    return Request(SYSTEM, TOOLS, (Message("user", (TextPart(text),)),))


def fixture_events(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in recorded(name)]


def signatures(name: str) -> list[str]:
    return [
        e["delta"]["signature"]
        for e in fixture_events(name)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "signature_delta"
    ]


def text_of(events: list[Any], kind: type = TextDelta) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


# --- Recorded streams -------------------------------------------------------------


async def test_it_streams_recorded_text_and_usage(fake_server):
    """Text deltas arrive in order, pings are skipped, Finish carries usage and stop reason."""
    fake_server.add(Reply(events=recorded(TEXT)))
    events = await collect(provider(fake_server).stream(ask()))
    assert text_of(events) == (
        "Hello! I'm doing well, thank you for asking. How are you doing today? "
        "Is there anything I can help you with?"
    )
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    assert events[-1] == Finish(Usage(input_tokens=12, output_tokens=30), "end_turn")


async def test_it_keeps_a_thinking_block_that_has_only_a_signature(fake_server):
    """With thinking display omitted the block has no text: it still ends with its signature."""
    fake_server.add(Reply(events=recorded(SIGNATURE_ONLY)))
    events = await collect(provider(fake_server).stream(ask()))
    (signature,) = signatures(SIGNATURE_ONLY)
    assert events[0] == ReasoningEnd(signature=signature)
    assert not any(isinstance(e, ReasoningDelta) for e in events)
    assert text_of(events).endswith("answer. ✅")
    assert events[-1] == Finish(Usage(input_tokens=47, output_tokens=496), "end_turn")


async def test_it_streams_interleaved_thinking_with_signatures_and_redacted_data(fake_server):
    """Thinking, text and a tool call in step one; thinking, redacted thinking, text in step two."""
    fake_server.add(Reply(events=recorded(INTERLEAVED_1)), Reply(events=recorded(INTERLEAVED_2)))
    p = provider(fake_server)
    first = await collect(p.stream(ask()))
    assert [type(e) for e in first] == [
        ReasoningDelta,
        ReasoningDelta,
        ReasoningEnd,
        TextDelta,
        TextDelta,
        ToolCallEvent,
        Finish,
    ]
    assert text_of(first, ReasoningDelta) == (
        "The user wants the weather. I'll call the weather tool for San Francisco ✓."
    )
    assert first[2] == ReasoningEnd(signature=signatures(INTERLEAVED_1)[0])
    assert first[5] == ToolCallEvent(
        "toolu_01WeatherSF", "weather", {"unit": "c", "location": "San Francisco"}
    )
    assert first[-1] == Finish(
        Usage(input_tokens=412, output_tokens=96, cache_write_tokens=1800), "tool_use"
    )

    second = await collect(p.stream(ask()))
    redacted = next(
        e["content_block"]["data"]
        for e in fixture_events(INTERLEAVED_2)
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "redacted_thinking"
    )
    assert second[1] == ReasoningEnd(signature=signatures(INTERLEAVED_2)[0])
    assert second[2] == ReasoningEnd(redacted_data=redacted)
    assert text_of(second) == "It's 18 °C and sunny in San Francisco."
    assert second[-1] == Finish(
        Usage(input_tokens=64, output_tokens=41, cache_read_tokens=1800, cache_write_tokens=120),
        "end_turn",
    )


async def test_it_assembles_tool_arguments_from_json_fragments(fake_server):
    """input_json_delta fragments (one of them empty) are joined and parsed at block stop."""
    fake_server.add(Reply(events=recorded(JSON_TOOL)))
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        ToolCallEvent(
            "toolu_01KFbKqPYSuAKujiL6mTfzYA",
            "json",
            {"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]},
        ),
        Finish(Usage(input_tokens=849, output_tokens=47), "tool_use"),
    ]


async def test_it_gives_a_tool_call_without_arguments_an_empty_object(fake_server):
    """A tool_use whose only fragment is empty has arguments {}."""
    fake_server.add(Reply(events=recorded(NO_ARGS)))
    events = await collect(provider(fake_server).stream(ask()))
    assert text_of(events) == "I'll update the issue list for you."
    assert events[-2] == ToolCallEvent("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", {})
    assert events[-1].stop_reason == "tool_use"


async def test_it_streams_several_tool_calls_of_one_response_in_order(fake_server):
    """Two tool_use blocks give two ToolCallEvents, in block order."""
    fake_server.add(Reply(events=recorded(PARALLEL)))
    events = await collect(provider(fake_server).stream(ask()))
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.call_id, c.name) for c in calls] == [
        ("toolu_01KFbKqPYSuAKujiL6mTfzYA", "json"),
        ("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList"),
    ]
    assert calls[1].arguments == {}


async def test_it_ignores_server_tool_blocks(fake_server):
    """server_tool_use and web_search_tool_result run at Anthropic: no event for them."""
    fake_server.add(Reply(events=recorded(WEB_SEARCH)))
    events = await collect(provider(fake_server).stream(ask()))
    assert [e for e in events if isinstance(e, ToolCallEvent)] == [
        ToolCallEvent("toolu_01SaveResults", "save_results", {"filename": "news.txt"})
    ]


# --- The request ------------------------------------------------------------------


def message_start(content: list[dict[str, Any]] | Any) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_prefilled",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    }


def message_end(stop_reason: str = "end_turn", output_tokens: int = 9) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


async def test_it_treats_content_prefilled_in_message_start_like_streamed_blocks(fake_server):
    """Text, a tool_use and a server tool's result that came whole in message_start are
    events like streamed ones (the server result is Anthropic's own); streamed blocks
    after them follow."""
    prefilled = [
        {"type": "text", "text": "Looking now."},
        {"type": "tool_use", "id": "toolu_pre", "name": "list_files", "input": {"path": "."}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    ]
    fake_server.add(
        Reply(
            events=[
                message_start(prefilled),
                {"type": "content_block_start", "index": 3, "content_block": {"type": "text"}},
                {
                    "type": "content_block_delta",
                    "index": 3,
                    "delta": {"type": "text_delta", "text": "And more."},
                },
                {"type": "content_block_stop", "index": 3},
                *message_end("tool_use"),
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        TextDelta("Looking now."),
        ToolCallEvent("toolu_pre", "list_files", {"path": "."}),
        TextDelta("And more."),
        Finish(Usage(input_tokens=12, output_tokens=9), "tool_use"),
    ]


UNEXPECTED_SHAPES = {
    "text delta that is an object": (
        [
            message_start([]),
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": {"value": "Hi"}},
            },
        ],
        "`content_block_delta.delta.text` of type dict",
    ),
    "message_start content that is an object": (
        [message_start({"type": "text", "text": "Hi"})],
        "`message_start.message.content` of type dict",
    ),
    "tool input that is a list": (
        [
            message_start(
                [{"type": "tool_use", "id": "toolu_1", "name": "list_files", "input": ["."]}]
            )
        ],
        "`message_start.message.content[0].input` of type list",
    ),
    "an event that is not an object": (["[1, 2]"], "`event` of type list"),
    "message_start whose message is a string": (
        [{"type": "message_start", "message": "Hi"}],
        "`message_start.message` of type str",
    ),
    "a prefilled block that is a string": (
        [message_start(["Hi"])],
        "`message_start.message.content[0]` of type str",
    ),
    "a content block that is a string": (
        [message_start([]), {"type": "content_block_start", "index": 0, "content_block": "Hi"}],
        "`content_block_start.content_block` of type str",
    ),
    "a block index that is a string": (
        [
            message_start([]),
            {"type": "content_block_start", "index": "0", "content_block": {"type": "text"}},
        ],
        "`content_block_start.index` of type str",
    ),
    "a delta that is a string": (
        [
            message_start([]),
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 0, "delta": "Hi"},
        ],
        "`content_block_delta.delta` of type str",
    ),
    "message_delta whose delta is a string": (
        [message_start([]), {"type": "message_delta", "delta": "end_turn"}],
        "`message_delta.delta` of type str",
    ),
}


@pytest.mark.parametrize("case", UNEXPECTED_SHAPES, ids=list(UNEXPECTED_SHAPES))
async def test_an_unexpected_shape_is_a_provider_error_naming_the_field(fake_server, case):
    """Well-formed JSON of a shape the adapter does not know: a non-retryable error that
    names the provider and the field, never an exception of another kind."""
    events, field = UNEXPECTED_SHAPES[case]
    fake_server.add(Reply(events=[*events, *message_end()]))
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server).stream(ask()))
    assert raised.value.message.startswith("Anthropic stream: unexpected ")
    assert field in raised.value.message
    assert raised.value.retryable is False
    assert raised.value.error_type == "unexpected_response"


async def test_it_sends_manual_thinking_with_the_interleaved_beta_and_no_sdk_retries(fake_server):
    """A manual-thinking model sends its budget and beta header; a 529 is tried once only."""
    fake_server.add(Reply.error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(ProviderError):
        await collect(provider(fake_server).stream(ask()))
    assert len(fake_server.requests) == 1
    record = fake_server.last
    assert record.path == "/v1/messages"
    assert record.headers["authorization"] == "Bearer test-key"
    assert record.headers["anthropic-beta"] == INTERLEAVED_THINKING_BETA
    assert record.json["thinking"] == {"type": "enabled", "budget_tokens": 8000}
    assert record.json["max_tokens"] == 64_000
    assert record.json["model"] == "claude-sonnet-4-5"
    assert record.json["stream"] is True


async def test_it_sends_adaptive_thinking_without_a_beta(fake_server):
    """An adaptive model sends thinking type adaptive and no beta header."""
    fake_server.add(Reply(events=recorded(TEXT)))
    await collect(provider(fake_server, "anthropic/claude-sonnet-5").stream(ask()))
    assert fake_server.last.json["thinking"] == {"type": "adaptive"}
    assert "anthropic-beta" not in fake_server.last.headers


async def test_it_sends_no_thinking_for_a_model_it_does_not_know(fake_server):
    """An unknown model of the provider gets the defaults: no thinking parameter."""
    fake_server.add(Reply(events=recorded(TEXT)))
    await collect(provider(fake_server, "anthropic/claude-future-9").stream(ask()))
    body = fake_server.last.json
    assert "thinking" not in body
    assert body["model"] == "claude-future-9"


def test_it_drops_unsigned_thinking_and_replays_signed_and_redacted_thinking_unchanged():
    """Thinking without signature or redacted data is not sent; the others go back as they came."""
    request = Request(
        "",
        (),
        (
            Message("user", (TextPart("hi"),)),
            Message(
                "assistant",
                (
                    ThinkingPart("from another provider"),
                    ThinkingPart("signed ✓", signature="sig+/="),
                    ThinkingPart("", redacted_data="REDACTED=="),
                    TextPart("hello"),
                ),
            ),
            Message("user", (TextPart("again"),)),
        ),
    )
    content = build_params(request, model_info(SONNET_45))["messages"][1]["content"]
    assert content == [
        {"type": "thinking", "thinking": "signed ✓", "signature": "sig+/="},
        {"type": "redacted_thinking", "data": "REDACTED=="},
        {"type": "text", "text": "hello"},
    ]


def test_it_drops_a_message_left_empty_and_merges_its_neighbours():
    """An assistant message of unsigned thinking only disappears; the user messages
    around it merge."""
    request = Request(
        "",
        (),
        (
            Message("user", (TextPart("one"),)),
            Message("assistant", (ThinkingPart("no signature"), TextPart(""))),
            Message("user", (TextPart("two"),)),
        ),
    )
    messages = build_params(request, model_info(SONNET_45))["messages"]
    assert [m["role"] for m in messages] == ["user"]
    assert [b["text"] for b in messages[0]["content"]] == ["one", "two"]


def test_it_places_breakpoints_on_the_last_tool_the_system_and_the_last_block():
    """Three cache breakpoints: last tool, system, the request's last cacheable block;
    never on thinking, on empty text, or on an earlier message."""
    request = Request(
        SYSTEM,
        tuple(reversed(TOOLS)),
        (
            Message("user", (TextPart("weather?"),)),
            Message(
                "assistant",
                (
                    ThinkingPart("think", signature="s1"),
                    ToolCallPart("c1", "weather", {"location": "Paris"}),
                ),
            ),
            Message("user", (ToolResultPart("c1", "weather", "sunny"),)),
            Message("assistant", (ThinkingPart("more", signature="s2"), TextPart(""))),
            Message("user", (TextPart("thanks"), TextPart(""))),
        ),
    )
    params = build_params(request, model_info(SONNET_45))
    marked = []
    for tool in params["tools"]:
        if "cache_control" in tool:
            marked.append(("tool", tool["name"]))
    for block in params["system"]:
        if "cache_control" in block:
            marked.append(("system", block["text"]))
    for i, message in enumerate(params["messages"]):
        for block in message["content"]:
            if "cache_control" in block:
                marked.append((i, block["type"]))
                assert block["cache_control"] == {"type": "ephemeral"}
    assert [t["name"] for t in params["tools"]] == ["list_files", "weather"]
    assert marked == [("tool", "weather"), ("system", SYSTEM), (4, "text")]


def test_it_sorts_tools_by_name_and_schema_keys():
    """Tools go out in name order with sorted schema keys, whatever order they were given in."""
    shuffled = ToolSpec("b_tool", "B", {"type": "object", "required": [], "properties": {}})
    params = build_params(
        Request("", (shuffled, TOOLS[0]), (Message("user", (TextPart("x"),)),)),
        model_info(SONNET_45),
    )
    assert [t["name"] for t in params["tools"]] == ["b_tool", "weather"]
    assert list(params["tools"][0]["input_schema"]) == ["properties", "required", "type"]


async def test_it_refuses_a_request_with_nothing_to_send(fake_server):
    """No message with content is a ValueError before any HTTP request."""
    empty = Request(SYSTEM, TOOLS, (Message("user", (TextPart(""),)),))
    with pytest.raises(ValueError, match="nothing to send"):
        await collect(provider(fake_server).stream(empty))
    assert fake_server.requests == []


def broken_tool_call(stop_reason: str) -> list[dict[str, Any]]:
    """A response whose tool call ends mid-arguments."""
    events = fixture_events(JSON_TOOL)
    events[4]["delta"]["partial_json"] = '{"elements": [{"loca'  # and no closing "}"
    del events[5]
    events[-2]["delta"]["stop_reason"] = stop_reason
    return events


async def test_it_drops_a_tool_call_cut_off_by_max_tokens(fake_server):
    """Arguments cut off by the output limit: no call, and Finish says max_tokens."""
    fake_server.add(Reply(events=broken_tool_call("max_tokens")))
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [Finish(Usage(input_tokens=849, output_tokens=47), "max_tokens")]


async def test_it_fails_on_tool_arguments_that_are_not_json(fake_server):
    """Broken arguments without the output limit to explain them: a retryable error."""
    fake_server.add(Reply(events=broken_tool_call("tool_use")))
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server).stream(ask()))
    assert raised.value.error_type == "invalid_response"
    assert "not JSON" in raised.value.message
    assert raised.value.retryable


# --- Errors -----------------------------------------------------------------------


TEXT_START = recorded(TEXT)[:4]  # message_start, block start, ping, "Hello"
ERRORS = {
    "429 with retry-after": (
        Reply.error(429, "rate_limit_error", "Slow down", headers={"retry-after": "7"}),
        (429, "rate_limit_error", True, 7.0),
    ),
    "529 overloaded": (
        Reply.error(529, "overloaded_error", "Overloaded"),
        (529, "overloaded_error", True, None),
    ),
    "500": (Reply.error(500, "api_error", "Internal server error"), (500, "api_error", True, None)),
    "500 with a body that is not JSON": (
        Reply(status=500, body="upstream exploded"),
        (500, None, True, None),
    ),
    "401 invalid key": (
        Reply.error(401, "authentication_error", "invalid x-api-key"),
        (401, "authentication_error", False, None),
    ),
    "400 invalid request": (
        Reply.error(400, "invalid_request_error", "messages: roles must alternate"),
        (400, "invalid_request_error", False, None),
    ),
    "in-stream overloaded error": (
        Reply(
            events=[
                *TEXT_START,
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            ]
        ),
        (529, "overloaded_error", True, None),
    ),
    "connection cut mid-stream": (
        Reply(events=[*TEXT_START, CUT]),
        (None, "connection_error", True, None),
    ),
    "malformed JSON line": (
        Reply(events=[*TEXT_START, Raw('{"type": "content_block_delta", "index": 0, "del')]),
        (None, "invalid_response", True, None),
    ),
    "stream ending without message_stop": (
        Reply(events=TEXT_START),
        (None, "connection_error", True, None),
    ),
}


@pytest.mark.parametrize("case", ERRORS, ids=list(ERRORS))
async def test_it_classifies_errors(fake_server, case):
    """Each failure becomes a ProviderError with its status, type, retry hint and
    retryability, after the events that came before it, and never a Finish."""
    reply, (status, kind, retryable, retry_after) = ERRORS[case]
    fake_server.add(reply)
    seen: list[Any] = []
    with pytest.raises(ProviderError) as raised:
        async for event in provider(fake_server).stream(ask()):
            seen.append(event)
    error = raised.value
    assert (error.status_code, error.error_type, error.retryable, error.retry_after) == (
        status,
        kind,
        retryable,
        retry_after,
    )
    assert error.message
    assert not any(isinstance(e, Finish) for e in seen)
    if reply.status == 200:
        assert text_of(seen) == "Hello"
    assert len(fake_server.requests) == 1


async def test_it_times_out_on_a_silent_stream(fake_server):
    """A stream that goes quiet longer than the read timeout fails as a retryable timeout."""
    fake_server.add(Reply(events=[*TEXT_START, Pause(5)]))
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server, timeout=0.3).stream(ask()))
    assert raised.value.error_type == "timeout"
    assert raised.value.retryable


async def test_it_reports_an_unreachable_server_as_a_connection_error(fake_server):
    """Nothing listening: a retryable connection error, not a hang."""
    fake_server.stop()
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server).stream(ask()))
    assert raised.value.error_type == "connection_error"
    assert raised.value.retryable


async def test_an_unscripted_request_gets_a_500_from_the_fake_server(fake_server):
    """The fake server answers a request it has no reply for with a 500 that says so."""
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server).stream(ask()))
    assert raised.value.status_code == 500
    assert "no reply scripted" in raised.value.message


# --- Cancelling -------------------------------------------------------------------


async def test_closing_the_stream_early_closes_the_connection(fake_server):
    """aclose() after the first event closes the HTTP connection; the server sees it."""
    fake_server.add(Reply(events=recorded(TEXT), delay=0.1))
    stream = provider(fake_server).stream(ask())
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()
    assert await asyncio.to_thread(fake_server.last.wait_disconnected)
    assert not fake_server.last.completed.is_set()


async def test_cancelling_the_task_closes_the_connection(fake_server):
    """Cancelling the task that reads the stream closes the HTTP connection."""
    fake_server.add(Reply(events=recorded(TEXT), delay=0.1))
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in provider(fake_server).stream(ask()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), TIMEOUT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(fake_server.last.wait_disconnected)


# --- A whole turn: the byte-stable prefix -----------------------------------------


def raw_members(text: str) -> dict[str, str]:
    """The raw JSON text of each member of a JSON object, as it was sent."""
    decoder = json.JSONDecoder()
    members: dict[str, str] = {}
    i = text.index("{") + 1
    while text[i] != "}":
        key, i = decoder.raw_decode(text, i)
        i = text.index(":", i) + 1
        start = i
        _, i = decoder.raw_decode(text, i)
        members[key] = text[start:i]
        if text[i] == ",":
            i += 1
    return members


def raw_items(text: str) -> list[str]:
    """The raw JSON text of each item of a JSON array, as it was sent."""
    decoder = json.JSONDecoder()
    items: list[str] = []
    i = 1
    while text[i] != "]":
        start = i
        _, i = decoder.raw_decode(text, i)
        items.append(text[start:i])
        if text[i] == ",":
            i += 1
    return items


def without_cache_control(message: dict[str, Any]) -> dict[str, Any]:
    return {
        **message,
        "content": [
            {k: v for k, v in block.items() if k != "cache_control"} for block in message["content"]
        ],
    }


async def test_a_three_step_turn_keeps_the_sent_prefix_byte_identical(fake_server):
    """Requests built by chat.history from a growing log: tools, system and every earlier
    message go out with the same bytes; only the moving breakpoints move; signatures and
    redacted thinking come back exactly as they were streamed."""
    p = provider(fake_server)
    turn = uuid.uuid4()
    log: list[Block] = []

    def append(block: Block) -> None:
        block.seq = len(log) + 1
        log.append(block)

    def user(text: str, turn_id: uuid.UUID) -> Block:
        return Block(uuid.uuid4(), turn_id, 0, "user", "text", {"text": text})

    append(user("What's the weather in San Francisco? And list my files.", turn))
    # Step 0 thinks and calls weather; step 1 calls two tools; step 2 thinks
    # (signed and redacted) and answers. Then the next turn asks a follow-up.
    scripts = [INTERLEAVED_1, PARALLEL, INTERLEAVED_2]
    for step, script in enumerate(scripts):
        fake_server.add(Reply(events=recorded(script)))
        reducer = Reducer(turn, step)
        request = Request(SYSTEM, TOOLS, History.build(log).messages())
        async for event in p.stream(request):
            for op in reducer.feed(event):
                if isinstance(op, Seal):
                    append(op.block)
        for block in [b for b in log if b.step == step and b.type == "tool_call"]:
            data = {
                "call_id": block.data["call_id"],
                "name": block.data["name"],
                "result": f"result of {block.data['name']}",
                "is_error": False,
            }
            append(Block(uuid.uuid4(), turn, step, "tool", "tool_result", data))
    append(user("Thanks! Anything else?", uuid.uuid4()))
    fake_server.add(Reply(events=recorded(TEXT)))
    await collect(p.stream(Request(SYSTEM, TOOLS, History.build(log).messages())))

    bodies = [r.body.decode() for r in fake_server.requests]
    assert len(bodies) == 4
    members = [raw_members(body) for body in bodies]
    # Tools and system: the same bytes in every request.
    assert len({m["tools"] for m in members}) == 1
    assert len({m["system"] for m in members}) == 1
    messages = [raw_items(m["messages"]) for m in members]
    assert [len(m) for m in messages] == [1, 3, 5, 7]
    for earlier in range(4):
        for later in range(earlier + 1, 4):
            kept = len(messages[earlier]) - 1
            # Every message but the last is a byte-identical JSON prefix...
            prefix = members[earlier]["messages"][
                : members[earlier]["messages"].rindex(messages[earlier][-1])
            ]
            assert members[later]["messages"].startswith(prefix)
            assert messages[later][:kept] == messages[earlier][:kept]
            # ...and the last differs at most by its moving breakpoint.
            assert without_cache_control(json.loads(messages[later][kept])) == (
                without_cache_control(json.loads(messages[earlier][kept]))
            )

    final = fake_server.last.json
    assert len(fake_server.last.body) > 0
    cached = [
        (i, block["type"])
        for i, message in enumerate(final["messages"])
        for block in message["content"]
        if "cache_control" in block
    ]
    assert cached == [(6, "text")]
    assert "cache_control" in final["tools"][-1]
    assert "cache_control" in final["system"][-1]
    # The thinking of steps 0 and 2 went back unmodified: text, signature, redacted data.
    thinking = [
        block
        for message in final["messages"]
        for block in message["content"]
        if block["type"] in ("thinking", "redacted_thinking")
    ]
    redacted = next(
        e["content_block"]["data"]
        for e in fixture_events(INTERLEAVED_2)
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "redacted_thinking"
    )
    assert thinking == [
        {
            "type": "thinking",
            "thinking": (
                "The user wants the weather. I'll call the weather tool for San Francisco ✓."
            ),
            "signature": signatures(INTERLEAVED_1)[0],
        },
        {
            "type": "thinking",
            "thinking": "18 °C and sunny. That answers it.",
            "signature": signatures(INTERLEAVED_2)[0],
        },
        {"type": "redacted_thinking", "data": redacted},
    ]
    for signature in signatures(INTERLEAVED_1) + signatures(INTERLEAVED_2) + [redacted]:
        assert json.dumps(signature).encode() in fake_server.last.body
