"""Hostile provider bodies through the real adapters: each ends in a clear ProviderError
(or the complete answer), never another exception, a hang, or unbounded memory."""

from __future__ import annotations

import asyncio

import pytest

from chat.providers import common, errors
from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import Finish, Message, ProviderError, Request, TextDelta, TextPart
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import model_info
from harness.rawhttp import RawServer, body, stall

NEST = b"[" * 20000 + b"]" * 20000
OK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
A_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
    b'{"input_tokens":1}}}\n\n'
)
A_BLOCK = (
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
A_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"complete answer"}}\n\n'
)
A_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
A_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

SERVER = RawServer(
    {
        "o_nested": body(b"data: " + NEST + b"\n\n"),
        "o_nested_error": body(OK, b'data: {"error": ' + NEST + b"}\n\n"),
        "o_nested_args": body(
            b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c",'
            b'"function":{"name":"f","arguments":"' + NEST + b'"}}]}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
            b"data: [DONE]\n\n",
        ),
        "a_nested": body(A_START, b"event: content_block_delta\ndata: " + NEST + b"\n\n"),
        "a_nested_error": body(A_START, b"event: error\ndata: " + NEST + b"\n\n"),
        "o_giant_line": body(b"data: " + b"x" * 4096, b"y" * 4096, b"z" * 4096),
        "o_giant_event": body(*[b"data: " + b"x" * 1000 + b"\n" for _ in range(10)]),
        "o_json_200": body(
            b'{"error":{"message":"model not found","type":"invalid_request_error"}}',
            content_type=b"application/json",
        ),
        "o_html_200": body(b"<html>Captive portal</html>", content_type=b"text/html"),
        "a_json_200": body(b'{"type":"message"}', content_type=b"application/json"),
        "a_stall_after_stop": body(A_START, A_BLOCK, A_DELTA, A_BLOCK_STOP, A_STOP, then=stall),
    }
)
REQUEST = Request("sys", (), (Message("user", (TextPart("hello"),)),))
# Far above what any case here needs; a hang fails the test instead of blocking it.
LIMIT = 10.0


def provider(name: str):
    if name.startswith("o_"):
        return OpenAIProvider(
            model_info("openai/gpt-4.1"), api_key="k", base_url=SERVER.url(name) + "/v1"
        )
    return AnthropicProvider(
        model_info("anthropic/claude-sonnet-4-5"), api_key="k", base_url=SERVER.url(name)
    )


async def events_of(name: str) -> list:
    async with asyncio.timeout(LIMIT):
        return [event async for event in provider(name).stream(REQUEST)]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("o_nested", "nested too deeply"),
        ("o_nested_args", "nested too deeply"),
        ("a_nested", "nested too deeply"),
    ],
)
async def test_json_nested_past_the_parsers_limit_is_a_malformed_stream(name, says):
    """Not a RecursionError escaping the adapter (an internal error, never retried)."""
    with pytest.raises(ProviderError) as caught:
        await events_of(name)
    assert says in caught.value.message


@pytest.mark.parametrize("name", ["o_nested_error", "a_nested_error"])
async def test_a_nested_error_body_is_quoted_not_a_crash(name):
    with pytest.raises(ProviderError):
        await events_of(name)


@pytest.mark.parametrize(
    ("name", "cap", "says"),
    [
        ("o_giant_line", "MAX_LINE_BYTES", "a line longer than 8000 bytes"),
        ("o_giant_event", "MAX_EVENT_BYTES", "an event larger than 8000 bytes"),
    ],
)
async def test_a_line_or_event_past_the_cap_is_refused(monkeypatch, name, cap, says):
    """A server that never ends a line (or an event) cannot make the process hold it all."""
    monkeypatch.setattr(common, cap, 8000)
    with pytest.raises(ProviderError) as caught:
        await events_of(name)
    assert says in caught.value.message and caught.value.error_type == "invalid_response"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("o_json_200", "application/json, not an event stream: model not found"),
        ("o_html_200", "text/html, not an event stream: <html>Captive portal</html>"),
        ("a_json_200", "application/json, not an event stream"),
    ],
)
async def test_a_200_that_is_not_an_event_stream_says_what_it_was_and_is_not_retried(name, says):
    with pytest.raises(ProviderError) as caught:
        await events_of(name)
    assert says in caught.value.message
    assert not caught.value.retryable


async def test_an_anthropic_answer_is_complete_at_message_stop_even_if_the_body_stays_open():
    """A proxy that keeps the body open after message_stop: the answer is not thrown
    away as a stalled stream (before, the loop waited for the body's end)."""
    events = await events_of("a_stall_after_stop")
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["complete answer"]
    assert isinstance(events[-1], Finish)


def test_the_decoder_keeps_a_long_line_in_pieces_and_splits_it_once():
    """Pieces without a line end are appended, not re-joined and re-scanned each time."""
    decoder = common.SSEDecoder()
    for _ in range(1000):
        assert list(decoder.feed(b"x" * 100)) == []
    assert list(decoder.feed(b"\n\n")) == []  # a line with no field name: no event
    assert list(decoder.feed(b"data: " + b"y" * 10 + b"\n\n")) == [(None, "y" * 10)]


def test_error_fields_of_nested_text_is_the_text():
    assert errors.error_fields("[" * 20000) == (None, "[" * 20000)
