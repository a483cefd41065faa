"""Which presenter a chunk gets: a table from (role, kind), then from kind alone; a
kind no presenter knows is shown as the bare `Item` ("unknown chunk type")."""

from __future__ import annotations

from typing import Any

from chat.chunks import Kind, Role
from chat.render.cards import ToolCall, ToolResult
from chat.render.item import Item
from chat.render.messages import Compaction, Error, Notice, Plan, Text, Thinking, UserText

# Where the role decides: a user's message is not an answer.
BY_ROLE_AND_KIND: dict[tuple[str, str], type[Item]] = {
    (Role.USER, Kind.TEXT): UserText,
}
BY_KIND: dict[str, type[Item]] = {
    Kind.TEXT: Text,
    Kind.THINKING: Thinking,
    Kind.TOOL_CALL: ToolCall,
    Kind.TOOL_RESULT: ToolResult,
    Kind.ERROR: Error,
    Kind.SYSTEM: Notice,
    Kind.COMPACTION: Compaction,
    Kind.PLAN: Plan,
}


def presenter_for(role: str, kind: str) -> type[Item]:
    return BY_ROLE_AND_KIND.get((role, kind)) or BY_KIND.get(kind, Item)


def present(chunk: Any, *, open: bool = False) -> Item:
    """A chunk's presenter, from a Chunk row or a stream Block (anything with the chunk
    fields)."""
    return presenter_for(chunk.role, chunk.type)(
        id=chunk.id,
        seq=chunk.seq,
        turn_id=chunk.turn_id,
        step=chunk.step,
        role=chunk.role,
        type=chunk.type,
        data=chunk.data or {},
        open=open,
        created_at=getattr(chunk, "created_at", None),
    )
