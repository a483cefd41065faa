"""The Responses API adapter against the fake server, through the real SDK: the event
mapping (a table over the recorded streams in fixtures/responses/), random splits of
the body, and bad input."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.providers import responses
from chat.providers.base import (
    Finish,
    Message,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    Request,
    TextDelta,
    TextPart,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from chat.providers.registry import model_info
from chat.providers.responses import REFUSAL_MARK, Reader, ResponsesProvider, classify
from chat.render import fragment_seal
from chat.stream import Reducer, Seal
from harness.fakeprovider import (
    CUT,
    FIXTURES,
    FakeProviderServer,
    Raw,
    Reply,
    ResponsesStream,
    collect,
    recorded,
)
from tests.ui_helpers import block

TIMEOUT = 5.0
STEP1 = "responses/reasoning-parallel-tools.1.jsonl"
STEP2 = "responses/reasoning-parallel-tools.2.jsonl"
WEATHER = ToolSpec("weather", "The weather in a city.", {"type": "object"})


def provider(server: FakeProviderServer, model: str = "openai/gpt-5") -> ResponsesProvider:
    return ResponsesProvider(
        model_info(model), api_key="test-key", base_url=server.openai_url, timeout=TIMEOUT
    )


def ask(text: str = "Weather in Paris and Oslo?") -> Request:
    return Request("Be brief.", (WEATHER,), (Message("user", (TextPart(text),)),), cache_key="t1")


def done_item(name: str, index: int) -> str:
    """The JSON text of the `response.output_item.done` item at `index` in a fixture, as
    the adapter keeps it (compact, in the wire's key order)."""
    for line in recorded(name):
        event = json.loads(line)
        if event["type"] == "response.output_item.done" and event["output_index"] == index:
            return json.dumps(event["item"], ensure_ascii=False, separators=(",", ":"))
    raise AssertionError(f"no item {index} in {name}")


# --- The event mapping: one row per recorded stream -------------------------------

SUMMARY = "**Checking two cities**\n\nThe user wants Paris and Oslo; one call each, in parallel."
TABLE = [
    (
        STEP1,
        [
            ReasoningDelta("**Checking two cities**\n\n"),
            ReasoningDelta("The user wants Paris and Oslo; "),
            ReasoningDelta("one call each, in parallel."),
            # The second summary part is a paragraph of its own.
            ReasoningDelta("\n\nCelsius for both."),
            # The id and encrypted content of .done, not of .added.
            ReasoningEnd(reasoning_item=done_item(STEP1, 0)),
            ToolCallEvent("call_01Paris", "weather", {"location": "Paris", "unit": "c"}),
            ToolCallEvent("call_02Oslo", "weather", {"location": "Oslo", "unit": "c"}),
            Finish(Usage(1320, 262, 0, 0, 192), "tool_use"),
        ],
    ),
    (
        STEP2,
        [
            # No summary at all: the item is still kept.
            ReasoningEnd(reasoning_item=done_item(STEP2, 0)),
            TextDelta("Paris: 18 °C and sunny. "),
            TextDelta("Oslo: no such city, says the tool."),
            # Cached input is a cache read, and not input.
            Finish(Usage(210, 58, 1280, 0, 24), "end_turn"),
        ],
    ),
    (
        "responses/text-no-created.jsonl",
        [TextDelta("Hello"), TextDelta(" there!"), Finish(Usage(25, 4), "end_turn")],
    ),
    (
        "responses/incomplete-max-output.jsonl",
        [
            ReasoningEnd(reasoning_item=done_item("responses/incomplete-max-output.jsonl", 0)),
            TextDelta("The first three steps are"),
            # The output limit: the turn writes its notice; the usage still counts.
            Finish(Usage(400, 512, 0, 0, 505), "max_tokens"),
        ],
    ),
    (
        "responses/refusal.jsonl",
        [
            TextDelta(REFUSAL_MARK + "I can't help "),
            TextDelta("with that."),
            Finish(Usage(30, 7), "refusal"),
        ],
    ),
]


@pytest.mark.parametrize(("name", "expected"), TABLE, ids=[row[0] for row in TABLE])
async def test_each_recorded_stream_maps_to_these_events(fake_server, name, expected):
    fake_server.add(Reply(events=recorded(name)))
    assert await collect(provider(fake_server).stream(ask())) == expected
    assert fake_server.last.path == "/v1/responses"


def test_the_reasoning_item_is_kept_as_it_came_key_order_included():
    item = json.loads(done_item(STEP1, 0), object_pairs_hook=list)
    assert [key for key, _ in item] == ["id", "type", "encrypted_content", "summary"]
    assert dict(item)["id"] == "rs_01Final"
    assert dict(item)["encrypted_content"] == "gAAAAABoFinalEncryptedReasoningÄ+/="


def test_a_reasoning_item_becomes_one_thinking_chunk_with_its_item():
    """Through the reducer: the summary is the thinking's text, the item rides with it;
    an item with no summary is a thinking chunk of its own, with empty text."""
    reducer = Reducer("turn", 1)
    seals = []
    for event in _events(STEP1) + _events(STEP2):
        seals += [op.block for op in reducer.feed(event) if isinstance(op, Seal)]
    thinking = [b for b in seals if b.type == "thinking"]
    assert thinking[0].data == {
        "text": SUMMARY + "\n\nCelsius for both.",
        "reasoning_item": done_item(STEP1, 0),
    }
    assert thinking[1].data == {"text": "", "reasoning_item": done_item(STEP2, 0)}


def _events(name: str) -> list[Any]:
    """The events of a recorded stream, read by the adapter's Reader (no server)."""
    reader = Reader()
    events = list(reader.feed(_body(name)))
    return events + reader.end()


def _body(name: str) -> bytes:
    """A recorded stream as the API sends it: `event:` and `data:` lines, no [DONE]."""
    frames = []
    for line in recorded(name):
        frames.append(f"event: {json.loads(line)['type']}\ndata: {line}\n\n")
    return "".join(frames).encode()


# --- Random splits of the body ------------------------------------------------------

STREAMS = sorted(p.name for p in (FIXTURES / "responses").glob("*.jsonl"))


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(STREAMS),
    st.lists(st.integers(min_value=0, max_value=10**6), max_size=40),
    st.booleans(),
)
def test_any_split_of_the_body_gives_the_same_events(name, cuts, crlf):
    """However the bytes arrive (cut inside a UTF-8 character, between CR and LF, one
    byte at a time), the events are the same, and so is the error of a failed stream."""
    body = _body("responses/" + name)
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert _outcome([body]) == _outcome(pieces)


def _outcome(pieces: list[bytes]) -> Any:
    reader = Reader()
    events: list[Any] = []
    try:
        for piece in pieces:
            events += reader.feed(piece)
        events += reader.end()
    except ProviderError as exc:
        return events, exc.message, exc.error_type, exc.retryable
    return events


# --- Bad input ------------------------------------------------------------------------


async def test_an_unknown_event_type_is_ignored_with_a_log_line(fake_server, caplog):
    lines = recorded("responses/text-no-created.jsonl")
    novel = {"type": "response.hologram.delta", "output_index": 0, "delta": "✨"}
    fake_server.add(Reply(events=[lines[0], novel, novel, *lines[1:]]))
    with caplog.at_level(logging.INFO, logger="chat.providers.responses"):
        events = await collect(provider(fake_server).stream(ask()))
    assert events[:2] == [TextDelta("Hello"), TextDelta(" there!")]
    said = [r.getMessage() for r in caplog.records if "hologram" in r.getMessage()]
    assert said == [
        "OpenAI (Responses API): ignoring an event of unknown type 'response.hologram.delta'"
    ], "once per type"


MALFORMED = [
    # (what is sent before the end, the error's type, words it must contain)
    (Raw("{not json", "response.output_text.delta"), "invalid_response", "malformed event"),
    (Raw("[1, 2]", "response.output_text.delta"), "unexpected_response", "`event`"),
    (
        {"type": "response.output_text.delta", "output_index": 0, "delta": 7},
        "unexpected_response",
        "`response.output_text.delta.delta` of type int",
    ),
    (
        {"type": "response.output_item.done", "output_index": "one", "item": {}},
        "unexpected_response",
        "output_index",
    ),
    (
        {"type": "response.output_item.done", "output_index": 3, "item": "rs"},
        "unexpected_response",
        "`response.output_item.done.item`",
    ),
    (
        {
            "type": "response.output_item.done",
            "output_index": 3,
            "item": {"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"},
        },
        "unexpected_response",
        ".name",
    ),
    (
        {"type": "response.completed", "response": {"usage": {"input_tokens": 1}}, "x": 1},
        None,
        None,
    ),
]


@pytest.mark.parametrize(("bad", "error_type", "words"), MALFORMED)
async def test_a_malformed_event_ends_the_stream_with_a_clear_error(
    fake_server, bad, error_type, words
):
    lines = recorded("responses/text-no-created.jsonl")
    fake_server.add(Reply(events=[lines[0], lines[2], bad, *lines[3:]]))
    if error_type is None:
        # The control row: a well-formed end where the bad event was.
        events = await collect(provider(fake_server).stream(ask()))
        assert events[-1] == Finish(Usage(1), "end_turn")
        return
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    assert caught.value.error_type == error_type
    assert words in caught.value.message
    assert caught.value.base_url == fake_server.openai_url


def test_an_event_with_no_type_at_all_is_an_error_naming_the_field():
    """Without a `type` in its data, an event is read by its SSE name; with neither it
    cannot be read."""
    with pytest.raises(ProviderError) as caught:
        list(Reader().feed(b'data: {"delta": "x"}\n\n'))
    assert "`event.type`" in caught.value.message
    named = b'event: response.output_text.delta\ndata: {"delta": "x"}\n\n'
    assert list(Reader().feed(named)) == [TextDelta("x")]


async def test_a_stream_that_ends_before_its_response_is_incomplete(fake_server):
    fake_server.add(Reply(events=recorded(STEP1)[:-1]))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    assert caught.value.transport == "incomplete" and caught.value.retryable


async def test_a_cut_connection_is_a_retryable_transport_error(fake_server):
    fake_server.add(Reply(events=[*recorded(STEP1)[:5], CUT]))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    assert caught.value.retryable and caught.value.transport is not None


ERRORS = [
    # (the events, status, code, retryable, words)
    (recorded("responses/failed.jsonl"), 500, "server_error", True, "The server had an error"),
    (recorded("responses/error-event.jsonl"), 429, "rate_limit_exceeded", True, "TPM"),
    # Nested under `error`, as some servers send it.
    (
        [{"type": "error", "error": {"code": "insufficient_quota", "message": "No credit."}}],
        429,
        "insufficient_quota",
        False,  # waiting adds no credit
        "No credit.",
    ),
    (
        [
            {
                "type": "response.failed",
                "response": {"error": {"code": "invalid_prompt", "message": "Not allowed."}},
            }
        ],
        400,
        "invalid_prompt",
        False,
        "Not allowed.",
    ),
    # No code at all: mid-stream, the server's trouble.
    ([{"type": "error", "message": "Something broke."}], None, None, True, "Something broke."),
]


@pytest.mark.parametrize(("events", "status", "code", "retryable", "words"), ERRORS)
async def test_failed_responses_and_error_events_carry_the_message_and_code(
    fake_server, events, status, code, retryable, words
):
    fake_server.add(Reply(events=events))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    error = caught.value
    assert (error.status_code, error.error_type, error.retryable) == (status, code, retryable)
    assert words in error.message and error.message.startswith("OpenAI (Responses API) error")


async def test_an_http_error_is_classified_by_its_status(fake_server):
    fake_server.add(Reply.error(429, "rate_limit_error", "slow down", {"retry-after": "7"}))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    assert caught.value.status_code == 429 and caught.value.retry_after == 7.0
    assert "test-key" not in caught.value.message


def _call_events(arguments: str, end: dict[str, Any]) -> list[dict[str, Any]]:
    item = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": arguments}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        end,
    ]


async def test_a_call_whose_arguments_are_not_json_is_an_error(fake_server):
    completed = {"type": "response.completed", "response": {"usage": None}}
    fake_server.add(Reply(events=_call_events('{"location": "Par', completed)))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(fake_server).stream(ask()))
    assert "the arguments of tool call weather are not JSON" in caught.value.message


async def test_a_call_cut_by_the_output_limit_is_dropped(fake_server):
    cut = {
        "type": "response.incomplete",
        "response": {"incomplete_details": {"reason": "max_output_tokens"}, "usage": None},
    }
    fake_server.add(Reply(events=_call_events('{"location": "Par', cut)))
    assert await collect(provider(fake_server).stream(ask())) == [Finish(Usage(), "max_tokens")]


async def test_items_sent_whole_without_deltas_are_still_read(fake_server):
    """A server that streams no deltas: the summary and the text come from the items."""
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Short."}],
        "encrypted_content": "e",
    }
    message = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Done."}],
    }
    fake_server.add(
        Reply(
            events=[
                {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
                {"type": "response.output_item.done", "output_index": 1, "item": message},
                {"type": "response.completed", "response": {}},
            ]
        )
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert events == [
        ReasoningDelta("Short."),
        ReasoningEnd(reasoning_item=json.dumps(reasoning, separators=(",", ":"))),
        TextDelta("Done."),
        Finish(Usage(), "end_turn"),
    ]


def test_a_reasoning_item_without_a_summary_is_shown_as_encrypted_reasoning():
    """The page says the reasoning is kept and sent back; the item itself is not shown."""
    data = {"text": "", "reasoning_item": done_item(STEP2, 0)}
    html = fragment_seal(block("thinking", data, turn_id="t", seq=3))
    assert "Reasoning (encrypted)" in html and "kept and sent back unchanged" in html
    assert "gAAAAABoSecondStepNoSummary" not in html
    shown = fragment_seal(block("thinking", {**data, "text": "A summary."}, turn_id="t", seq=4))
    assert "A summary." in shown and "encrypted" not in shown


def test_the_sdks_bare_api_error_is_explained_like_the_event():
    """If the SDK reads an `error` event itself it raises a bare APIError (no status):
    the same error as the event, never an unclassified one."""
    request = httpx2.Request("POST", "https://api.openai.com/v1/responses")
    body = {"code": "server_error", "message": "Try again."}
    error = classify(openai.APIError("Try again.", request, body=body))
    assert (error.error_type, error.status_code, error.retryable) == ("server_error", 500, True)
    assert error.message == "OpenAI (Responses API) error (server_error): Try again."
    bare = classify(openai.APIError("Stream broke.", request, body=None))
    assert bare.message.endswith(": Stream broke.") and bare.retryable


async def test_the_harness_builds_streams_the_adapter_reads(fake_server):
    """harness.ResponsesStream, for replies built from a request: what it says is what
    the adapter gets."""
    stream = (
        ResponsesStream()
        .reasoning("rs_7", ["One.", "Two."], "enc-7")
        .call("c1", "weather", {"location": "Paris"})
        .call("c2", "weather", {"location": "Oslo"})
    )
    fake_server.add(Reply(events=stream.events(input_tokens=50, cached=20, reasoning_tokens=9)))
    events = await collect(provider(fake_server).stream(ask()))
    item = {
        "id": "rs_7",
        "type": "reasoning",
        "encrypted_content": "enc-7",
        "summary": [{"type": "summary_text", "text": t} for t in ("One.", "Two.")],
    }
    assert events[:6] == [
        ReasoningDelta("One."),
        ReasoningDelta("\n\nTwo."),
        ReasoningEnd(reasoning_item=json.dumps(item, separators=(",", ":"))),
        ToolCallEvent("c1", "weather", {"location": "Paris"}),
        ToolCallEvent("c2", "weather", {"location": "Oslo"}),
        events[5],
    ]
    finish = events[5]
    assert isinstance(finish, Finish) and finish.stop_reason == "tool_use"
    assert (finish.usage.input_tokens, finish.usage.cache_read_tokens) == (30, 20)
    assert finish.usage.reasoning_tokens == 9
    assert finish.usage.output_tokens > 9


async def test_an_endpoint_refusing_reasoning_summaries_is_asked_again_without(
    fake_server, monkeypatch
):
    """OpenAI refuses `reasoning.summary` to an organisation it has not verified: the
    request is sent again without it (reasoning is still kept between steps), and so is
    every later request to that endpoint; any other 400 is the error it is."""
    monkeypatch.setattr(responses, "_NO_SUMMARY", set())
    refusal = {
        "error": {
            "message": "Your organization must be verified to generate reasoning summaries.",
            "type": "invalid_request_error",
            "param": "reasoning.summary",
            "code": "unsupported_value",
        }
    }
    fake_server.add(
        Reply(status=400, body=refusal),
        Reply(events=ResponsesStream().text("Hi.").events()),
        Reply(events=ResponsesStream().text("Again.").events()),
        Reply.error(400, "invalid_request_error", "Unsupported parameter: 'temperature'."),
    )
    events = await collect(provider(fake_server).stream(ask()))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hi."]
    await collect(provider(fake_server).stream(ask()))
    sent = [r.json for r in fake_server.requests]
    assert sent[0]["reasoning"] == {"summary": "auto"}
    assert "reasoning" not in sent[1] and "reasoning" not in sent[2]
    assert sent[1]["include"] == ["reasoning.encrypted_content"]
    with pytest.raises(ProviderError, match="temperature"):
        await collect(provider(fake_server).stream(ask()))
    assert len(fake_server.requests) == 4


@pytest.mark.parametrize(
    ("model", "reasoning"),
    [
        ("gpt-5", True),
        ("gpt-5-mini", True),
        ("o4-mini", True),
        ("o3", True),
        ("codex-mini-latest", True),
        ("gpt-5-chat-latest", False),
        ("gpt-4.1", False),
        ("gpt-4o", False),
    ],
)
def test_reasoning_models_are_told_apart_by_name(model, reasoning):
    info = model_info(f"openai/{model}")
    assert responses.is_reasoning(info) is reasoning
    params = responses.build_params(ask(), info)
    assert ("reasoning" in params, "include" in params) == (reasoning, reasoning)
