"""Helpers for the pure-core tests (reducer and request builder): no Django.

`MemoryLog` stands in for chat.log: it applies a reducer's ops the way the turn
runner does, checks the op protocol as it goes, and appends sealed blocks with
seqs 1..n. `assert_valid_request` states the provider's rules for a request.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chat.providers.base import (
    Event,
    Message,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)
from chat.stream import Block, Delta, Kind, Op, Open, Reducer, Role, Seal

# Anthropic's tool_use id rule; the builder must produce ids that match it.
SAFE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


@dataclass
class MemoryLog:
    """The chunk log in memory, plus what was streamed into each chunk."""

    blocks: list[Block] = field(default_factory=list)
    streamed: dict[uuid.UUID, str] = field(default_factory=dict)  # open snapshot + deltas
    open_id: uuid.UUID | None = None

    def append(self, block: Block) -> Block:
        assert block.seq is None, f"block {block.id} sealed twice"
        block.seq = len(self.blocks) + 1
        self.blocks.append(block)
        return block

    def user(self, text: str, turn_id: uuid.UUID | None = None) -> Block:
        """A user text chunk, as the runner appends it at step 0."""
        return self.append(Block(uuid.uuid4(), turn_id, 0, Role.USER, Kind.TEXT, {"text": text}))

    def apply(self, ops: Iterable[Op]) -> list[Op]:
        """Apply ops in order, checking the open/delta/seal protocol."""
        ops = list(ops)
        for op in ops:
            match op:
                case Open(block=block):
                    assert self.open_id is None, "a block opened while another is open"
                    assert block.id not in self.streamed, "a block opened twice"
                    self.open_id = block.id
                    self.streamed[block.id] = block.text
                case Delta(chunk_id=chunk_id, offset=offset, text=text):
                    assert chunk_id == self.open_id, "a delta for a block that is not open"
                    assert offset == len(self.streamed[chunk_id]), "a delta at the wrong offset"
                    assert text, "an empty delta"
                    self.streamed[chunk_id] += text
                case Seal(block=block):
                    if block.id in self.streamed:
                        assert block.id == self.open_id, "a sealed block sealed again"
                        assert block.text == self.streamed[block.id], "sealed body != streamed"
                        self.open_id = None
                    else:
                        assert self.open_id is None, "a new block sealed while one is open"
                    self.append(block)
        return ops

    def feed(self, reducer: Reducer, events: Iterable[Event]) -> list[Op]:
        ops: list[Op] = []
        for event in events:
            ops += self.apply(reducer.feed(event))
        return ops


def to_bytes(message: Message) -> bytes:
    """A message as the byte-stability rule sees it: JSON with sorted keys."""
    return json.dumps(dataclasses.asdict(message), sort_keys=True).encode()


def assert_valid_request(messages: Sequence[Message]) -> None:
    """The provider's rules: alternation, tool calls answered at once, no empty text."""
    seen_ids: set[str] = set()
    for i, message in enumerate(messages):
        expected_role = Role.USER if i % 2 == 0 else Role.ASSISTANT
        assert message.role == expected_role, f"message {i} is {message.role}"
        assert message.parts, f"message {i} is empty"
        for part in message.parts:
            match part:
                case TextPart(text=text):
                    assert text, f"message {i} has an empty text part"
                case ThinkingPart():
                    assert message.role == Role.ASSISTANT
                    assert part.text or part.signature or part.redacted_data
                case ToolCallPart(call_id=call_id):
                    assert message.role == Role.ASSISTANT
                    assert SAFE_ID.match(call_id), f"unsafe call id {call_id!r}"
                    assert call_id not in seen_ids, f"call id {call_id!r} used twice"
                    seen_ids.add(call_id)
                    assert list(part.arguments) == sorted(part.arguments)
                case ToolResultPart(result=result):
                    assert message.role == Role.USER
                    assert result, f"message {i} has an empty tool result"
                case _:
                    raise AssertionError(f"unknown part {part!r}")
        calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
        results_after = _leading_results(messages[i + 1]) if i + 1 < len(messages) else None
        if message.role == Role.ASSISTANT:
            assert results_after is not None, "the request ends with the assistant"
            # Result order is free; each call is answered once, by id and name.
            answered = [(r.call_id, r.name) for r in results_after]
            assert sorted(answered) == sorted((c.call_id, c.name) for c in calls), (
                f"message {i}'s calls are not answered exactly once by message {i + 1}"
            )
        else:
            n = len(_leading_results(message))
            assert not any(isinstance(p, ToolResultPart) for p in message.parts[n:]), (
                f"message {i} has a tool result after other content"
            )
            if i == 0:
                assert n == 0, "the first message answers no call"
    if messages:
        assert messages[-1].role == Role.USER, "the request ends with the assistant"


def _leading_results(message: Message) -> list[ToolResultPart]:
    out = []
    for part in message.parts:
        if not isinstance(part, ToolResultPart):
            break
        out.append(part)
    return out


def reloaded(blocks: Iterable[Block]) -> list[Block]:
    """The blocks as read back from a database whose JSON reorders keys.

    PostgreSQL's jsonb keeps keys sorted by length, then bytes; this reverses
    them instead, which is just as foreign to the order they were written in.
    """

    def scramble(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: scramble(value[k]) for k in sorted(value, reverse=True)}
        if isinstance(value, list):
            return [scramble(v) for v in value]
        return value

    return [dataclasses.replace(b, data=scramble(json.loads(json.dumps(b.data)))) for b in blocks]
