"""Scripting the fake Anthropic server for whole turns, and reading the request bodies it got.

Replies are built block by block (`reply(thinking(...), text(...), tool_use(...))`), as
the Messages API streams them. Request bodies are read as the bytes the SDK sent:
`Body` splits one into what comes before the messages, each content block, and what
comes after (model, system, thinking, tools), so that two requests can be compared
byte for byte up to a given block.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chat.models import QueuedMessage, RunningTurn
from harness.fakeprovider import Reply

MODEL = "anthropic/claude-sonnet-4-5"
# The prompt-cache marker as the SDK writes it. The adapter moves the last one to
# each request's last block, so it is the one thing two requests sharing a prefix
# may differ in; comparisons remove it, explicitly, and count what they removed.
MARKER = ',"cache_control":{"type":"ephemeral"}'
# Tools, system prompt, and the request's last block (chat/providers/anthropic.py).
MARKERS_PER_REQUEST = 3
# Bound on waiting for a turn started elsewhere (a branch that runs at once).
SETTLE_SECONDS = 30.0
POLL_SECONDS = 0.02


def use_anthropic(monkeypatch, server) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)


# --- Replies ----------------------------------------------------------------------


def message_start(usage: dict[str, int] | None = None) -> dict[str, Any]:
    """The first event; `usage` as the API reports it at the start (input_tokens,
    cache_read_input_tokens, cache_creation_input_tokens)."""
    return {
        "type": "message_start",
        "message": {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 50, "output_tokens": 1, **(usage or {})},
        },
    }


def message_end(stop_reason: str, output_tokens: int = 20) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


Block = Callable[[int], list[dict[str, Any]]]


def thinking(text: str, signature: str | None) -> Block:
    """A thinking block; without a signature, it is cut off before it was signed
    (nothing after it: follow it with a STALL or an error)."""

    def block(index: int) -> list[dict[str, Any]]:
        events = [
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
            _delta(index, {"type": "thinking_delta", "thinking": text}),
        ]
        if signature is not None:
            events += [
                _delta(index, {"type": "signature_delta", "signature": signature}),
                {"type": "content_block_stop", "index": index},
            ]
        return events

    return block


def text(*pieces: str, stop: bool = True) -> Block:
    """A text block streamed in `pieces`; `stop=False` leaves it open (cut off)."""

    def block(index: int) -> list[dict[str, Any]]:
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "text"}}
        events = [start]
        events += [_delta(index, {"type": "text_delta", "text": p}) for p in pieces]
        if stop:
            events.append({"type": "content_block_stop", "index": index})
        return events

    return block


def tool_use(call_id: str, name: str, **arguments: Any) -> Block:
    def block(index: int) -> list[dict[str, Any]]:
        start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        return [
            {"type": "content_block_start", "index": index, "content_block": start},
            _delta(index, {"type": "input_json_delta", "partial_json": json.dumps(arguments)}),
            {"type": "content_block_stop", "index": index},
        ]

    return block


def reply(
    *blocks: Block,
    stop: str | None = "end_turn",
    then: Sequence[Any] = (),
    usage: dict[str, int] | None = None,
    output_tokens: int = 20,
) -> Reply:
    """A streamed response of these blocks (numbered in order), ending with `stop`
    (None: no end, for a reply cut by what `then` holds: a STALL, an error event);
    `usage` and `output_tokens` as the API reports them (see message_start)."""
    events: list[Any] = [message_start(usage)]
    for index, block in enumerate(blocks):
        events += block(index)
    if stop is not None:
        events += message_end(stop, output_tokens)
    return Reply(events=[*events, *then])


def stream_error(kind: str, message: str) -> dict[str, Any]:
    """An `event: error` inside a 200 stream."""
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- Request bodies -------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A request body as sent, cache markers removed, split at its content blocks.

    `text` is the body decoded (UTF-8, so equal texts are equal bytes); `head` is
    everything before the first message, `tail` everything after the messages
    (model, stream flag, system, thinking, tools); `block_ends[i]` is the offset in
    `text` right after content block i, counting blocks across messages in order.
    """

    text: str
    markers: int
    head: str
    tail: str
    blocks: list[dict[str, Any]]
    block_ends: list[int]

    @classmethod
    def of(cls, raw: bytes) -> Body:
        sent = raw.decode()
        text = sent.replace(MARKER, "")
        markers = (len(sent) - len(text)) // len(MARKER)
        decoder = json.JSONDecoder()
        opening = '{"max_tokens":'
        assert text.startswith(opening), text[:80]
        start = text.index(',"messages":[') + len(',"messages":[')
        blocks: list[dict[str, Any]] = []
        ends: list[int] = []
        at = start
        while text[at] != "]":
            message, message_end = decoder.raw_decode(text, at)
            prefix = f'{{"role":"{message["role"]}","content":['
            assert text.startswith(prefix, at), text[at : at + 80]
            inner = at + len(prefix)
            while text[inner] != "]":
                block, inner = decoder.raw_decode(text, inner)
                blocks.append(block)
                ends.append(inner)
                if text[inner] == ",":
                    inner += 1
            assert text[inner : inner + 2] == "]}" and inner + 2 == message_end
            at = message_end + 1 if text[message_end] == "," else message_end
        return cls(text, markers, text[:start], text[at:], blocks, ends)


def assert_same_prefix(parent: bytes, branch: bytes, *, blocks: int) -> tuple[Body, Body]:
    """`branch` is byte for byte `parent` through its first `blocks` content blocks,
    with the same model, system prompt, thinking settings and tools, once the cache
    markers (and only those) are removed from both. Returns both bodies."""
    p, b = Body.of(parent), Body.of(branch)
    assert (p.markers, b.markers) == (MARKERS_PER_REQUEST, MARKERS_PER_REQUEST)
    assert b.head == p.head
    assert b.tail == p.tail
    end = p.block_ends[blocks - 1]
    assert b.text[:end] == p.text[:end]
    assert len(b.blocks) > blocks, "the branch sent nothing of its own after the cut"
    return p, b


async def settled(tab_id: uuid.UUID, timeout: float = SETTLE_SECONDS) -> None:
    """Wait until the tab has no turn running or waiting to start (a branch that runs
    at once starts before anyone can watch its group)."""
    async with asyncio.timeout(timeout):
        while (
            await QueuedMessage.objects.filter(tab_id=tab_id).aexists()
            or await RunningTurn.objects.filter(tab_id=tab_id).aexists()
        ):
            await asyncio.sleep(POLL_SECONDS)
