"""The OpenAI-compatible adapter against the fake server, through the real SDK."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

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
from chat.providers.openai import OpenAIProvider, build_params
from chat.providers.registry import model_info
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

DEEPSEEK_REASONING = "recorded-streams/deepseek__deepseek-reasoning.chunks.txt"
DEEPSEEK_TOOL = "recorded-streams/deepseek__deepseek-tool-call.chunks.txt"
XAI_TOOL = "recorded-streams/openai-compatible__xai-tool-call.chunks.txt"
TINY = "recorded-streams/openai-compatible__tiny-chunks.chunks.txt"
AZURE = "recorded-streams/openai-compatible__azure-text.chunks.txt"
PARALLEL = "derived/openai-parallel-tools.chunks.txt"

WEATHER = ToolSpec(
    "weather",
    "The weather in a city.",
    {"type": "object", "required": ["location"], "properties": {"location": {"type": "string"}}},
)
SYSTEM = "You are a careful assistant."


def provider(
    server: FakeProviderServer, model: str = "openai/gpt-4.1", timeout: float = TIMEOUT
) -> OpenAIProvider:
    return OpenAIProvider(
        model_info(model), api_key="test-key", base_url=server.openai_url, timeout=timeout
    )


def ask(text: str = "Hello") -> Request:
    return Request(SYSTEM, (WEATHER,), (Message("user", (TextPart(text),)),))


def text_of(events: list[Any], kind: type = TextDelta) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def kinds(events: list[Any]) -> list[type]:
    """Event types with runs of one type collapsed: the shape of a stream."""
    shape: list[type] = []
    for event in events:
        if not shape or shape[-1] is not type(event):
            shape.append(type(event))
    return shape


# --- Recorded streams -------------------------------------------------------------


async def test_it_streams_deepseek_reasoning_content_then_text(fake_server):
    """reasoning_content deltas become reasoning, ended before the text starts; the usage
    of the last chunk counts cache hits apart from fresh input."""
    fake_server.add(Reply(events=recorded(DEEPSEEK_REASONING)))
    events = await collect(provider(fake_server, "deepseek/deepseek-reasoner").stream(ask()))
    assert kinds(events) == [ReasoningDelta, ReasoningEnd, TextDelta, Finish]
    assert text_of(events, ReasoningDelta).startswith("We need answer simple. Need count r")
    assert text_of(events, ReasoningDelta).endswith("total 3 r's. Need answer.")
    assert text_of(events) == "There are **3** “r”s in **“strawberry”**."
    assert events[-1] == Finish(Usage(input_tokens=97, output_tokens=106), "end_turn")


async def test_it_assembles_a_tool_call_from_argument_fragments(fake_server):
    """DeepSeek streams arguments a few characters at a time: joined, parsed, one call;
    cached prompt tokens are reported as cache reads."""
    fake_server.add(Reply(events=recorded(DEEPSEEK_TOOL)))
    events = await collect(provider(fake_server, "deepseek/deepseek-reasoner").stream(ask()))
    assert kinds(events) == [ReasoningDelta, ReasoningEnd, ToolCallEvent, Finish]
    assert text_of(events, ReasoningDelta) == (
        "The user asks about the weather in San Francisco. I should use the weather tool."
    )
    assert events[-2] == ToolCallEvent(
        "call_00_IhCAliIHtM9gKpgfqbBV9873", "weather", {"location": "San Francisco"}
    )
    assert events[-1] == Finish(
        Usage(input_tokens=118, output_tokens=61, cache_read_tokens=256), "tool_use"
    )


async def test_it_takes_usage_from_a_last_chunk_without_choices(fake_server):
    """xAI sends the whole call in one fragment and usage only in a final chunk with
    choices: []; both are taken."""
    fake_server.add(Reply(events=recorded(XAI_TOOL)))
    events = await collect(provider(fake_server).stream(ask()))
    assert events[-2] == ToolCallEvent("call_79382389", "weather", {"location": "San Francisco"})
    assert events[-1] == Finish(
        Usage(input_tokens=1, output_tokens=26, cache_read_tokens=306), "tool_use"
    )
    assert text_of(events, ReasoningDelta).startswith("First, the user is asking about the weather")


async def test_it_survives_chunks_without_choices_or_delta(fake_server):
    """Azure's prompt-filter chunk has no choices and its content-filter chunk no delta;
    usage comes only in the last chunk."""
    fake_server.add(Reply(events=recorded(AZURE)))
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        TextDelta("Hello"),
        TextDelta(" World"),
        Finish(Usage(input_tokens=15, output_tokens=5), "end_turn"),
    ]


async def test_it_reports_zero_usage_when_the_server_sends_none(fake_server):
    """A stream without a usage chunk still finishes, with empty usage."""
    fake_server.add(Reply(events=recorded(TINY)))
    events = await collect(provider(fake_server).stream(ask()))
    assert text_of(events, ReasoningDelta) == 'First, the user said: "Hello." That is simple.'
    assert text_of(events) == "Hi there!"
    assert events[-1] == Finish(Usage(), "end_turn")


async def test_it_keeps_the_first_id_and_name_of_each_tool_call_index(fake_server):
    """Two calls with interleaved fragments; the second repeats id and name in every
    fragment, which must not be concatenated."""
    fake_server.add(Reply(events=recorded(PARALLEL)))
    events = await collect(provider(fake_server).stream(ask()))
    assert [e for e in events if isinstance(e, ToolCallEvent)] == [
        ToolCallEvent("call_00_SF", "get_weather", {"location": "San Francisco"}),
        ToolCallEvent("call_01_NYC", "get_weather", {"location": "New York"}),
    ]


async def test_it_reads_reasoning_from_the_reasoning_field(fake_server):
    """vLLM and Ollama put reasoning in `delta.reasoning`; Ollama says "stop" after calls."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "qwen3",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    fake_server.add(
        Reply(
            events=[
                chunk({"role": "assistant", "reasoning": "Think"}),
                chunk({"reasoning": "ing."}),
                chunk({"tool_calls": [{"index": 0, "function": {"name": "weather"}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"location":'}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Oslo"}'}}]}),
                chunk({}, finish="stop"),
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        ReasoningDelta("Think"),
        ReasoningDelta("ing."),
        ReasoningEnd(),
        ToolCallEvent("call_0", "weather", {"location": "Oslo"}),
        Finish(Usage(), "tool_use"),
    ]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "magistral",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def thinking_part(*texts: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": [{"type": "text", "text": t} for t in texts]}


async def test_it_reads_content_sent_as_a_list_of_typed_parts(fake_server):
    """Mistral's content parts: thinking parts (holding text parts) are reasoning, text
    parts are text, and a plain string after them still counts."""
    fake_server.add(
        Reply(
            events=[
                chunk({"role": "assistant", "content": [thinking_part("Let me ", "think.")]}),
                chunk({"content": [thinking_part(" Done.")]}),
                chunk({"content": [{"type": "text", "text": "Hello"}]}),
                chunk({"content": " there."}, finish="stop"),
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        ReasoningDelta("Let me think."),
        ReasoningDelta(" Done."),
        ReasoningEnd(),
        TextDelta("Hello"),
        TextDelta(" there."),
        Finish(Usage(), "end_turn"),
    ]


UNEXPECTED_SHAPES = {
    "a content part of an unknown type": (
        chunk({"content": [{"type": "reference", "reference_ids": [1]}]}),
        "`choices[0].delta.content[0]` of type dict",
    ),
    "a thinking part holding an image": (
        chunk({"content": [{"type": "thinking", "thinking": [{"type": "image_url"}]}]}),
        "`choices[0].delta.content[0].thinking[0]` of type dict",
    ),
    "content that is an object": (
        chunk({"content": {"text": "Hi"}}),
        "`choices[0].delta.content` of type dict",
    ),
    "reasoning that is a list": (
        chunk({"reasoning_content": ["Hm"]}),
        "`choices[0].delta.reasoning_content` of type list",
    ),
    "tool arguments that are an object": (
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": {"a": 1}}}]}),
        "`choices[0].delta.tool_calls[0].function.arguments` of type dict",
    ),
    "a chunk that is not an object": ("[1, 2]", "`chunk` of type list"),
    "choices that are an object": ({"choices": {"index": 0}}, "`choices` of type dict"),
    "a choice that is a string": ({"choices": ["Hi"]}, "`choices[0]` of type str"),
    "a delta that is a string": (
        {"choices": [{"index": 0, "delta": "Hi"}]},
        "`choices[0].delta` of type str",
    ),
    "a finish reason that is a number": (
        {"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]},
        "`choices[0].finish_reason` of type int",
    ),
    "usage that is a number": ({"choices": [], "usage": 27}, "`usage` of type int"),
    "a tool call fragment that is a string": (
        chunk({"tool_calls": ["weather"]}),
        "`choices[0].delta.tool_calls[0]` of type str",
    ),
    "a tool call function that is a string": (
        chunk({"tool_calls": [{"index": 0, "id": "c", "function": "weather"}]}),
        "`choices[0].delta.tool_calls[0].function` of type str",
    ),
}


@pytest.mark.parametrize("case", UNEXPECTED_SHAPES, ids=list(UNEXPECTED_SHAPES))
async def test_an_unexpected_shape_is_a_provider_error_naming_the_field(fake_server, case):
    """Well-formed JSON of a shape the adapter does not know: a non-retryable error that
    names the provider and the field, never an exception of another kind."""
    bad, field = UNEXPECTED_SHAPES[case]
    fake_server.add(Reply(events=[chunk({"content": "Hi"}), bad, chunk({}, finish="stop")]))
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server).stream(ask()))
    assert raised.value.message.startswith("OpenAI-compatible server stream: unexpected ")
    assert field in raised.value.message
    assert raised.value.retryable is False
    assert raised.value.error_type == "unexpected_response"


async def test_a_length_stop_after_a_complete_tool_call_still_says_max_tokens(fake_server):
    """A call that finished before the output limit runs, and the stop reason still says
    the limit cut the response (not tool_use)."""
    fake_server.add(
        Reply(
            events=[
                chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "weather"}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                chunk({"content": "and then"}, finish="length"),
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events[-2:] == [ToolCallEvent("c", "weather", {}), Finish(Usage(), "max_tokens")]


# --- The request ------------------------------------------------------------------


def conversation() -> Request:
    return Request(
        SYSTEM,
        (WEATHER,),
        (
            Message("user", (TextPart("Weather in Paris and Oslo?"),)),
            Message(
                "assistant",
                (
                    ThinkingPart("Two cities.", signature="anthropic-sig"),
                    TextPart("Checking."),
                    ToolCallPart("c1", "weather", {"location": "Paris", "unit": "c"}),
                    ToolCallPart("c2", "weather", {"unit": "c", "location": "Oslo"}),
                ),
            ),
            Message(
                "user",
                (
                    ToolResultPart("c1", "weather", "sunny"),
                    ToolResultPart("c2", "weather", "no such city", is_error=True),
                    TextPart("Also, hurry."),
                ),
            ),
            Message("assistant", (ThinkingPart("Done."), TextPart("Paris is sunny."))),
            Message("user", (TextPart("Thanks"),)),
        ),
    )


async def test_it_splits_tool_results_into_tool_messages_then_a_user_message(fake_server):
    """The neutral user message becomes role:tool messages (in call order), then the text;
    arguments are JSON with sorted keys; usage is asked for; SDK retries are off."""
    fake_server.add(Reply.error(503, "server_error", "busy"))
    with pytest.raises(ProviderError):
        await collect(provider(fake_server).stream(conversation()))
    assert len(fake_server.requests) == 1
    record = fake_server.last
    assert record.path == "/v1/chat/completions"
    assert record.headers["authorization"] == "Bearer test-key"
    body = record.json
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "gpt-4.1"
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "weather",
                        "arguments": '{"location": "Paris", "unit": "c"}',
                    },
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "weather",
                        "arguments": '{"location": "Oslo", "unit": "c"}',
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: no such city"},
        {"role": "user", "content": "Also, hurry."},
        {"role": "assistant", "content": "Paris is sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city.",
                "parameters": {
                    "properties": {"location": {"type": "string"}},
                    "required": ["location"],
                    "type": "object",
                },
            },
        }
    ]


def test_it_sends_reasoning_back_only_where_the_model_needs_it():
    """DeepSeek's thinking mode gets reasoning_content on assistant messages with tool
    calls; other models and messages without calls never do."""
    deepseek = build_params(conversation(), model_info("deepseek/deepseek-reasoner"))["messages"]
    assistants = [m for m in deepseek if m["role"] == "assistant"]
    assert assistants[0]["reasoning_content"] == "Two cities."
    assert "reasoning_content" not in assistants[1]
    gpt = build_params(conversation(), model_info("openai/gpt-4.1"))["messages"]
    assert not any("reasoning_content" in m for m in gpt)


def test_it_gives_an_assistant_message_of_only_reasoning_empty_content():
    """An assistant message needs content or calls: reasoning alone leaves content ""."""
    request = Request(
        "",
        (),
        (
            Message("user", (TextPart("hi"),)),
            Message("assistant", (ThinkingPart("hmm"),)),
            Message("user", (TextPart("well?"),)),
        ),
    )
    messages = build_params(request, model_info("openai/gpt-4.1"))["messages"]
    assert messages[1] == {"role": "assistant", "content": ""}
    assert "tools" not in build_params(request, model_info("openai/gpt-4.1"))


def test_its_request_prefix_is_byte_stable_as_the_conversation_grows():
    """Serialising a longer conversation leaves the JSON of the earlier messages unchanged."""
    full = conversation()
    model = model_info("deepseek/deepseek-reasoner")
    for n in range(1, len(full.messages)):
        shorter = Request(full.system, full.tools, full.messages[:n])
        before = json.dumps(build_params(shorter, model)["messages"])
        after = json.dumps(build_params(full, model)["messages"])
        assert after.startswith(before[:-1])


async def test_it_drops_a_tool_call_cut_off_by_the_length_limit(fake_server):
    """finish_reason "length" with unfinished arguments: no call, Finish says max_tokens."""
    fake_server.add(
        Reply(
            events=[
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "content": "Calling.",
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c",
                                        "function": {"name": "weather", "arguments": '{"loc'},
                                    }
                                ],
                            },
                            "finish_reason": "length",
                        }
                    ]
                }
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [TextDelta("Calling."), Finish(Usage(), "max_tokens")]


async def test_it_refuses_a_request_with_nothing_to_send(fake_server):
    """No message with content is a ValueError before any HTTP request."""
    empty = Request(SYSTEM, (WEATHER,), (Message("user", (TextPart(""),)),))
    with pytest.raises(ValueError, match="nothing to send"):
        await collect(provider(fake_server).stream(empty))
    assert fake_server.requests == []


# --- Errors -----------------------------------------------------------------------


TINY_START = recorded(TINY)[:3]
ERRORS = {
    "429 with retry-after": (
        Reply.error(429, "rate_limit_error", "Slow down", headers={"retry-after": "7"}),
        (429, "rate_limit_error", True, 7.0),
    ),
    "429 with retry-after-ms": (
        Reply.error(429, "rate_limit_error", "Slow down", headers={"retry-after-ms": "1500"}),
        (429, "rate_limit_error", True, 1.5),
    ),
    "500": (Reply.error(500, "server_error", "boom"), (500, "server_error", True, None)),
    "503 overloaded": (Reply.error(503, "server_error", "busy"), (503, "server_error", True, None)),
    "401 invalid key": (
        Reply.error(401, "invalid_api_key", "Incorrect API key provided"),
        (401, "invalid_api_key", False, None),
    ),
    "404 unknown model": (
        Reply.error(404, "model_not_found", "The model does not exist"),
        (404, "model_not_found", False, None),
    ),
    "in-stream error": (
        Reply(events=[*TINY_START, {"error": {"type": "server_error", "message": "overloaded"}}]),
        (None, "server_error", True, None),
    ),
    "connection cut mid-stream": (
        Reply(events=[*TINY_START, CUT]),
        (None, "connection_error", True, None),
    ),
    "malformed JSON line": (
        Reply(events=[*TINY_START, Raw('{"id": "test-1", "choices": [{"ind')]),
        (None, "invalid_response", True, None),
    ),
    "stream ending without a finish reason": (
        Reply(events=TINY_START, done=False),
        (None, "connection_error", True, None),
    ),
    "tool arguments that are not JSON": (
        Reply(
            events=[
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c",
                                        "function": {"name": "weather", "arguments": '{"loc'},
                                    }
                                ]
                            },
                            "finish_reason": "tool_calls",
                        }
                    ]
                }
            ]
        ),
        (None, "invalid_response", True, None),
    ),
}


@pytest.mark.parametrize("case", ERRORS, ids=list(ERRORS))
async def test_it_classifies_errors(fake_server, case):
    """Each failure becomes a ProviderError with its status, type, retry hint and
    retryability, and the stream never finishes normally."""
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
    assert len(fake_server.requests) == 1


async def test_it_times_out_on_a_silent_stream(fake_server):
    """A stream that goes quiet longer than the read timeout fails as a retryable timeout."""
    fake_server.add(Reply(events=[*TINY_START, Pause(5)]))
    with pytest.raises(ProviderError) as raised:
        await collect(provider(fake_server, timeout=0.3).stream(ask()))
    assert raised.value.error_type == "timeout"
    assert raised.value.retryable


# --- Cancelling -------------------------------------------------------------------


async def test_closing_the_stream_early_closes_the_connection(fake_server):
    """aclose() after the first event closes the HTTP connection; the server sees it."""
    fake_server.add(Reply(events=recorded(TINY), delay=0.05))
    stream = provider(fake_server).stream(ask())
    assert isinstance(await anext(stream), ReasoningDelta)
    await stream.aclose()
    assert await asyncio.to_thread(fake_server.last.wait_disconnected)
    assert not fake_server.last.completed.is_set()


async def test_cancelling_the_task_closes_the_connection(fake_server):
    """Cancelling the task that reads the stream closes the HTTP connection."""
    fake_server.add(Reply(events=recorded(TINY), delay=0.05))
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
