"""The request builder: chunk log in, provider-neutral request messages out.

Pure: no Django imports. Chunks are anything with the attributes `seq, turn_id,
step, role, type, data` (a `chat.models.Chunk` or a `chat.stream.Block`).

The fold is incremental: a `History` keeps the messages it has finished, so the
request for step N+1 costs what step N added, and the bytes of every finished
message stay identical from one request to the next (prompt caching and
thinking signatures depend on that).

Normalisations, each deterministic so that rebuilding gives the same bytes:
- system and error chunks are never sent; empty text is dropped;
- thinking is kept as it is, even with empty text when it carries a signature
  or redacted data; a thinking chunk with neither and no text is dropped;
- tool arguments are re-ordered with sorted keys (PostgreSQL's jsonb re-orders
  keys on its own, which would otherwise change the bytes after a reload);
- call ids are made safe (`[a-zA-Z0-9_-]`) and unique in the request;
- tool results go first in the user message that follows their call; a call
  without a result (a crash) gets a synthetic error result; a result without a
  call is dropped;
- roles alternate user/assistant starting with user; adjacent messages of one
  role are merged, and a trailing assistant message without tool calls is
  left out (a request must end with the user's side).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from chat.providers.base import (
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)

UNSAFE_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
MISSING_RESULT = "No result was recorded for this call (the turn was interrupted)."
CONVERSATION_START = "(conversation start)"


class ChunkLike(Protocol):
    seq: int | None
    turn_id: Any
    step: int
    role: str
    type: str
    data: dict[str, Any]


def canonical(value: Any) -> Any:
    """The same JSON value with every object's keys sorted."""
    if isinstance(value, Mapping):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


@dataclass(slots=True)
class _Draft:
    role: str
    parts: list[Part] = field(default_factory=list)
    # Assistant: original call id -> (safe id, tool name), in call order.
    calls: dict[str, tuple[str, str]] = field(default_factory=dict)
    # User: the calls of the assistant message before, and which are answered.
    expects: dict[str, tuple[str, str]] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)

    def freeze(self) -> Message:
        parts = self.parts
        missing = [c for c in self.expects if c not in self.answered]
        if missing:
            at = _results_end(parts)
            synthetic = [
                ToolResultPart(*self.expects[c], MISSING_RESULT, True) for c in missing
            ]
            parts = [*parts[:at], *synthetic, *parts[at:]]
        return Message(self.role, tuple(parts))


@dataclass(slots=True)
class History:
    """Folds chunks, in seq order, into request messages."""

    _done: list[Message] = field(default_factory=list)
    _draft: _Draft | None = None
    _used_ids: set[str] = field(default_factory=set)
    last_seq: int = 0

    @classmethod
    def build(cls, chunks: Iterable[ChunkLike]) -> History:
        history = cls()
        history.extend(chunks)
        return history

    def extend(self, chunks: Iterable[ChunkLike]) -> None:
        for chunk in chunks:
            self.add(chunk)

    def add(self, chunk: ChunkLike) -> None:
        if chunk.seq is not None:
            if chunk.seq <= self.last_seq:
                raise ValueError(f"chunk seq {chunk.seq} is not after {self.last_seq}")
            self.last_seq = chunk.seq
        data = chunk.data
        match chunk.role, chunk.type:
            case "user", "text":
                if data.get("text"):
                    self._to("user").parts.append(TextPart(data["text"]))
            case "assistant", "text":
                if data.get("text"):
                    self._to("assistant").parts.append(TextPart(data["text"]))
            case "assistant", "thinking":
                signature = data.get("signature")
                redacted = data.get("redacted_data")
                if data.get("text") or signature or redacted:
                    part = ThinkingPart(data.get("text", ""), signature, redacted)
                    self._to("assistant").parts.append(part)
            case "assistant", "tool_call":
                draft = self._to("assistant")
                safe = self._safe_id(data["call_id"], chunk.seq)
                draft.calls[data["call_id"]] = (safe, data["name"])
                args = canonical(data.get("arguments") or {})
                draft.parts.append(ToolCallPart(safe, data["name"], args))
            case "tool", "tool_result":
                self._result(data)
            # system and error chunks are the UI's, never the model's.

    def messages(self) -> tuple[Message, ...]:
        """The request messages for the next step."""
        draft = self._draft
        if draft is None:
            return tuple(self._done)
        if draft.role == "assistant":
            if not draft.calls:
                return tuple(self._done)
            # Calls with no results yet: answer them so the request is valid.
            answers = _Draft("user", expects=draft.calls)
            return (*self._done, draft.freeze(), answers.freeze())
        return (*self._done, draft.freeze())

    def _to(self, role: str) -> _Draft:
        """The draft message of `role`, finishing the other one."""
        draft = self._draft
        if draft is not None and draft.role == role:
            return draft
        expects = draft.calls if draft is not None else {}
        if draft is not None and (draft.parts or draft.expects):
            self._done.append(draft.freeze())
        if role == "assistant" and not self._done:
            # A request starts with the user; a log that does not gets a marker.
            self._done.append(Message("user", (TextPart(CONVERSATION_START),)))
        if self._done and self._done[-1].role == role:
            # The message between was empty: continue the one before it.
            previous = self._done.pop()
            self._draft = _Draft(role, list(previous.parts))
        else:
            self._draft = _Draft(role, expects=expects if role == "user" else {})
        return self._draft

    def _result(self, data: Mapping[str, Any]) -> None:
        draft = self._draft
        if draft is not None and draft.role == "assistant":
            expects = draft.calls
        elif draft is not None:
            expects = draft.expects
        else:
            expects = {}
        call_id = data["call_id"]
        if call_id not in expects:
            return  # no such call in the message before: not sendable
        draft = self._to("user")
        if call_id in draft.answered:
            return
        draft.answered.add(call_id)
        safe, name = expects[call_id]
        part = ToolResultPart(
            safe, name, str(data.get("result", "")), bool(data.get("is_error"))
        )
        draft.parts.insert(_results_end(draft.parts), part)

    def _safe_id(self, call_id: str, seq: int | None) -> str:
        safe = UNSAFE_ID_CHARS.sub("_", call_id) or f"call_{seq}"
        candidate, n = safe, 1
        while candidate in self._used_ids:
            n += 1
            candidate = f"{safe}_{n}"
        self._used_ids.add(candidate)
        return candidate


def _results_end(parts: list[Part]) -> int:
    i = 0
    while i < len(parts) and isinstance(parts[i], ToolResultPart):
        i += 1
    return i


def build(chunks: Iterable[ChunkLike]) -> tuple[Message, ...]:
    """The request messages for a whole log (cold build)."""
    return History.build(chunks).messages()
