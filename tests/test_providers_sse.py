"""The server-sent events reader the adapters share (chat.providers.common.SSEDecoder),
and what the adapters' readers make of a body that is not UTF-8."""

from __future__ import annotations

import pytest

from chat.providers import anthropic, openai
from chat.providers.base import ProviderError
from chat.providers.common import SSEDecoder

BODY = (
    b": a comment, then an event with a name\r\n"
    b"event: message_start\r\n"
    b'data: {"a": "\xc3\xa9\xe2\x9c\x93"}\r\n'
    b"\r\n"
    b"data: first line\n"
    b"data:second line, no space\n"
    b"data:  two spaces keep one\n"
    b"\n"
    b"event: ping\r"
    b"data\r"
    b"\r"
)
EVENTS = [
    ("message_start", '{"a": "é✓"}'),
    (None, "first line\nsecond line, no space\n two spaces keep one"),
    ("ping", ""),
]


def read(decoder: SSEDecoder, *pieces: bytes) -> list[tuple[str | None, str]]:
    return [event for piece in pieces for event in decoder.feed(piece)]


def test_it_reads_names_data_lines_comments_and_every_line_end():
    """LF, CRLF and CR end lines; data lines join with LF; one space after the colon
    goes; a field without a colon has an empty value; comments are skipped."""
    assert read(SSEDecoder(), BODY) == EVENTS


def test_it_reads_the_same_events_whatever_the_split():
    """Cut in two anywhere (inside a CRLF, a UTF-8 character, a field name): the same
    events."""
    for at in range(1, len(BODY)):
        assert read(SSEDecoder(), BODY[:at], BODY[at:]) == EVENTS, f"cut at byte {at}"


def test_it_reads_a_body_fed_byte_by_byte():
    decoder = SSEDecoder()
    assert read(decoder, *(BODY[i : i + 1] for i in range(len(BODY)))) == EVENTS


def test_an_event_without_data_is_not_dispatched():
    """As the spec says: `event:`, `id:` and `retry:` alone make no event, and the
    name does not carry over to the next event."""
    body = b"event: ping\n\nid: 7\nretry: 10\n\n\n\ndata: x\n\n"
    assert read(SSEDecoder(), body) == [(None, "x")]


def test_an_event_is_only_dispatched_by_its_blank_line():
    """An event whose blank line has not come (the body cut before it) is not given."""
    decoder = SSEDecoder()
    assert read(decoder, b"data: complete\n\ndata: cut") == [(None, "complete")]
    assert read(decoder, b" off\n") == []
    assert read(decoder, b"\n") == [(None, "cut off")]


def test_a_line_that_is_not_utf8_raises_after_the_events_before_it():
    """The events the piece completed before the bad line still come out."""
    events = SSEDecoder().feed(b"data: fine\n\ndata: \xff\n\n")
    assert next(events) == (None, "fine")
    with pytest.raises(UnicodeDecodeError):
        next(events)


@pytest.mark.parametrize(
    ("reader", "message"),
    [
        (openai.Reader, "OpenAI-compatible server: malformed chunk in the stream"),
        (anthropic.Reader, "Anthropic: malformed event in the stream"),
    ],
    ids=["openai", "anthropic"],
)
def test_a_body_that_is_not_utf8_is_a_retryable_provider_error(reader, message):
    """A retry usually gets a clean stream: invalid_response, retryable, saying why."""
    with pytest.raises(ProviderError) as raised:
        list(reader().feed(b"event: message_start\ndata: \xff\n\n"))
    assert raised.value.message.startswith(message)
    assert "utf-8" in raised.value.message
    assert (raised.value.error_type, raised.value.retryable) == ("invalid_response", True)
