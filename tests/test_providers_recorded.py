"""Every recorded and derived stream gives the events it gave when the adapters still
read the SDKs' parsed objects (tests/fixtures/expected-events/, written by that code),
through the fake server and through the raw readers with the body cut anywhere."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from chat.providers import anthropic, openai
from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import Message, Request, TextPart
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import model_info
from harness.fakeprovider import FIXTURES, Reply, collect, recorded

EXPECTED = sorted((FIXTURES / "expected-events").glob("*.json"))
REQUEST = Request("sys", (), (Message("user", (TextPart("hi"),)),))
# Piece sizes the body is cut into, in turn: every split a network could make
# within a line, a CRLF, a multi-byte character.
PIECES = (1, 2, 3, 5, 8, 13, 1, 64)


def expected(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def as_json(events: list[Any]) -> list[dict[str, Any]]:
    """Events as the expected files hold them."""
    return json.loads(
        json.dumps([{"event": type(e).__name__, **dataclasses.asdict(e)} for e in events])
    )


def wire(adapter: str, lines: list[str], newline: str) -> bytes:
    """The body the fake server sends for these data lines, with `newline` ending lines."""
    frames = []
    for line in lines:
        if adapter == "anthropic":
            frames.append(f"event: {json.loads(line)['type']}{newline}data: {line}{newline}")
        else:
            frames.append(f"data: {line}{newline}")
    if adapter == "openai":
        frames.append(f"data: [DONE]{newline}")
    return newline.join(frames).encode() + newline.encode()


def cut(body: bytes) -> list[bytes]:
    pieces, i, n = [], 0, 0
    while i < len(body):
        size = PIECES[n % len(PIECES)]
        pieces.append(body[i : i + size])
        i, n = i + size, n + 1
    return pieces


def read(adapter: str, pieces: list[bytes]) -> list[Any]:
    reader = anthropic.Reader() if adapter == "anthropic" else openai.Reader()
    events: list[Any] = []
    for piece in pieces:
        events += reader.feed(piece)
    end = reader.end()
    return events + (end if isinstance(end, list) else [end])


def test_every_stream_has_expected_events():
    """The expected files cover every recorded and derived stream, and say so."""
    streams = sorted(
        str(p.relative_to(FIXTURES))
        for d in ("recorded-streams", "derived")
        for p in (FIXTURES / d).glob("*.chunks.txt")
    )
    assert sorted(expected(p)["stream"] for p in EXPECTED) == streams


@pytest.mark.parametrize("path", EXPECTED, ids=[p.stem for p in EXPECTED])
async def test_a_recorded_stream_gives_the_same_events_through_the_sdk(fake_server, path):
    """Through the real SDK client and the fake server: the events of the old path."""
    case = expected(path)
    fake_server.add(Reply(events=recorded(case["stream"])))
    if case["adapter"] == "anthropic":
        provider = AnthropicProvider(
            model_info("anthropic/claude-sonnet-4-5"), api_key="k", base_url=fake_server.url
        )
    else:
        provider = OpenAIProvider(
            model_info("openai/gpt-4.1"), api_key="k", base_url=fake_server.openai_url
        )
    assert as_json(await collect(provider.stream(REQUEST))) == case["events"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("path", EXPECTED, ids=[p.stem for p in EXPECTED])
def test_a_recorded_stream_gives_the_same_events_cut_anywhere(path, newline):
    """The body in small pieces (lines, line ends and UTF-8 characters split between
    them), with any of the three line ends: still the events of the old path."""
    case = expected(path)
    body = wire(case["adapter"], recorded(case["stream"]), newline)
    assert as_json(read(case["adapter"], cut(body))) == case["events"]
