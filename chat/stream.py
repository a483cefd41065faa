"""The reducer: provider-neutral events in, chunk lifecycle ops out.

Pure: no Django imports. The turn runner feeds every event of a step through one
Reducer and applies the ops it returns: `Open` and `Delta` go to the checkpoint
and the browser, `Seal` goes to the log (which assigns the seq) and the browser.

At most one block is open at a time. Consecutive deltas of one kind extend it;
any other event seals it first. An empty text or reasoning delta carries
nothing, so it neither opens a block nor seals the open one (an empty chunk in
the log would be an empty bubble and a wasted write). An empty shell-output
event does open its tool_result: the runner uses it to show that a tool started.

Delta offsets count Python `str` characters (code points), not UTF-16 units.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from chat.chunks import (
    AssistantText,
    ChunkData,
    Error,
    FileRef,
    Plan,
    PlanEntry,
    SystemNotice,
    Thinking,
    ToolCall,
    ToolResult,
    untyped,
)

# Defined in chat.chunks; re-exported for the modules that import them from here.
from chat.chunks import Kind as Kind
from chat.chunks import Role as Role
from chat.chunks import body_key as body_key
from chat.providers.base import (
    ErrorEvent,
    Event,
    Finish,
    PlanEvent,
    ReasoningDelta,
    ReasoningEnd,
    ShellOutput,
    SystemEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)


class ChunkLike(Protocol):
    """What the pure modules read of a chunk: a Chunk row or a Block. Read-only
    properties, so that a field declared narrower (a Chunk row's `seq: int`) or as the
    model's column type (its `data` JSONField) still fits: a plain attribute here would
    also promise that any value of these types may be written back."""

    @property
    def seq(self) -> int | None: ...
    @property
    def turn_id(self) -> Any: ...
    @property
    def step(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class Block:
    """A chunk outside the database: open while streaming, final once sealed.

    `seq` is None until the log appends it.
    """

    id: uuid.UUID
    turn_id: uuid.UUID | None
    step: int
    role: str
    type: str
    data: dict[str, Any]
    seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the form ops travel in and checkpoints are stored in."""
        return {
            "id": str(self.id),
            "turn_id": str(self.turn_id) if self.turn_id else None,
            "step": self.step,
            "role": self.role,
            "type": self.type,
            "data": self.data,
            "seq": self.seq,
        }

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Block:
        return cls(
            id=uuid.UUID(fields["id"]),
            turn_id=uuid.UUID(fields["turn_id"]) if fields.get("turn_id") else None,
            step=fields["step"],
            role=fields["role"],
            type=fields["type"],
            data=fields["data"],
            seq=fields.get("seq"),
        )

    @property
    def text(self) -> str:
        """The streamable body: text, thinking or live tool output."""
        body: str = self.data.get(body_key(self.type), "")
        return body


@dataclass(frozen=True, slots=True)
class Open:
    block: Block  # a copy taken at open time: later deltas do not change it


@dataclass(frozen=True, slots=True)
class Delta:
    chunk_id: uuid.UUID
    offset: int  # length of the block's body before this text
    text: str


@dataclass(frozen=True, slots=True)
class Seal:
    block: Block


Op = Open | Delta | Seal


@dataclass(slots=True)
class Reducer:
    turn_id: uuid.UUID | None
    step: int = 0
    new_id: Callable[[], uuid.UUID] = uuid.uuid4
    _open: Block | None = None
    # Deltas not yet joined into the open block's body, and the body's length.
    # Joining on every delta would copy the whole body each time: quadratic in
    # a long block (seconds for a few hundred KB of shell output).
    _pieces: list[str] = field(default_factory=list)
    _length: int = 0
    # (call_id, name) of calls made and not yet answered, in call order. A list,
    # not a dict: some servers repeat or omit call ids, and each result must
    # still take the name of its own call (first unanswered one with that id).
    pending_calls: list[tuple[str, str]] = field(default_factory=list)

    @property
    def open(self) -> Block | None:
        """The open block, its body complete up to the last delta fed."""
        block = self._open
        if block is not None and self._pieces:
            key = body_key(block.type)
            block.data[key] = block.data[key] + "".join(self._pieces)
            self._pieces.clear()
        return block

    def feed(self, event: Event) -> list[Op]:
        match event:
            case TextDelta(text=text):
                return self._extend(Role.ASSISTANT, Kind.TEXT, None, text)
            case ReasoningDelta(text=text):
                return self._extend(Role.ASSISTANT, Kind.THINKING, None, text)
            case ReasoningEnd(signature=signature, redacted_data=redacted, reasoning_item=item):
                return self._end_reasoning(signature, redacted, item)
            case ShellOutput(call_id=call_id, text=text):
                return self._extend(Role.TOOL, Kind.TOOL_RESULT, call_id, text)
            case ToolCallEvent(call_id=call_id, name=name, arguments=arguments, title=title):
                if not name:
                    # A nameless call can never be sent back; refuse it here
                    # rather than write a log row that breaks every request.
                    raise ValueError(f"tool call {call_id!r} has no tool name")
                self.pending_calls.append((call_id, name))
                call = ToolCall(call_id=call_id, name=name, arguments=dict(arguments))
                if title:
                    call["title"] = title
                return self._single(Role.ASSISTANT, Kind.TOOL_CALL, call)
            case ToolResultEvent():
                return self._result(event)
            case ErrorEvent(message=message, status_code=status_code, details=details):
                error = Error(message=message)
                if status_code is not None:
                    error["status_code"] = status_code
                if details:
                    untyped(error).update(details)
                return self._single(Role.ASSISTANT, Kind.ERROR, error)
            case SystemEvent(kind=kind, text=text):
                return self._single(Role.SYSTEM, Kind.SYSTEM, SystemNotice(kind=kind, text=text))
            case PlanEvent(entries=entries, omitted=omitted):
                plan = Plan(entries=[cast(PlanEntry, dict(entry)) for entry in entries])
                if omitted:
                    plan["omitted"] = omitted
                return self._single(Role.ASSISTANT, Kind.PLAN, plan)
            case Finish():
                return self.seal()
        raise TypeError(f"not a provider event: {event!r}")

    def seal(self, **extra: Any) -> list[Op]:
        """Seal the open block as it is (end of step, cancel, crash recovery)."""
        block = self.open
        if block is None:
            return []
        self._open = None
        block.data.update(extra)
        return [Seal(block)]

    def _new(self, role: str, kind: str, data: dict[str, Any]) -> Block:
        return Block(self.new_id(), self.turn_id, self.step, role, kind, data)

    def _single(self, role: str, kind: str, data: ChunkData) -> list[Op]:
        return [*self.seal(), Seal(self._new(role, kind, untyped(data)))]

    def _extend(self, role: str, kind: str, call_id: str | None, text: str) -> list[Op]:
        block = self._open
        if not (
            block is not None
            and block.type == kind
            and (call_id is None or block.data.get("call_id") == call_id)
        ):
            if not text and kind != Kind.TOOL_RESULT:
                return []
            ops: list[Op] = self.seal()
            data: ChunkData
            if kind == Kind.TOOL_RESULT:
                call_id = call_id or ""  # ShellOutput always names its call
                data = ToolResult(call_id=call_id, name=self._call_name(call_id), shell_output="")
            else:
                data = AssistantText(text="")
            block = self._open = self._new(role, kind, untyped(data))
            self._length = 0
            ops.append(Open(replace(block, data=dict(block.data))))
        else:
            ops = []
        if not text:
            return ops
        offset = self._length
        self._pieces.append(text)
        self._length += len(text)
        ops.append(Delta(block.id, offset, text))
        return ops

    def _end_reasoning(
        self, signature: str | None, redacted: str | None, item: str | None = None
    ) -> list[Op]:
        ops: list[Op] = []
        if self._open is None or self._open.type != Kind.THINKING:
            ops += self.seal()
            if not (signature or redacted or item):
                return ops  # nothing streamed and nothing to replay: no block
            # Signature-only thinking (display omitted) or redacted thinking
            # arrives with no deltas; it is still a block and must be kept.
            self._open = self._new(Role.ASSISTANT, Kind.THINKING, untyped(Thinking(text="")))
        meta = {}
        if signature is not None:
            meta["signature"] = signature
        if redacted is not None:
            meta["redacted_data"] = redacted
        if item is not None:
            meta["reasoning_item"] = item
        return ops + self.seal(**meta)

    def _call_name(self, call_id: str) -> str:
        return next((name for cid, name in self.pending_calls if cid == call_id), "")

    def _result(self, event: ToolResultEvent) -> list[Op]:
        # The call's name wins over the result's: the result event may come
        # from a runner that does not know it.
        name = event.name
        for i, (cid, call_name) in enumerate(self.pending_calls):
            if cid == event.call_id:
                del self.pending_calls[i]
                name = call_name or event.name
                break
        data = ToolResult(
            call_id=event.call_id, name=name, result=event.result, is_error=event.is_error
        )
        if event.truncated:
            data["truncated"] = True
        if event.truncated_bytes:
            # Never sent (history sends the result): the page says how much was cut.
            data["truncated_bytes"] = event.truncated_bytes
            data["truncated_lines"] = event.truncated_lines
        if event.attachments:
            data["attachments"] = [cast(FileRef, dict(ref)) for ref in event.attachments]
        block = self.open
        if (
            block is not None
            and block.type == Kind.TOOL_RESULT
            and block.data.get("call_id") == event.call_id
        ):
            # The live output streamed into this block; the result completes it.
            shell_output = event.shell_output or block.data.get("shell_output", "")
            block.data = untyped(
                ToolResult(**data, shell_output=shell_output) if shell_output else data
            )
            self._open = None
            return [Seal(block)]
        if event.shell_output:
            data["shell_output"] = event.shell_output
        return self._single(Role.TOOL, Kind.TOOL_RESULT, data)
