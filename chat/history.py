"""The request builder: chunk log in, provider-neutral request messages out.

Pure: no Django imports. Chunks are anything with the attributes `seq, turn_id,
step, role, type, data` (a `chat.models.Chunk` or a `chat.stream.Block`).

The fold is incremental: a `History` keeps the messages it has finished, so the
request for step N+1 costs what step N added, and the bytes of every finished
message stay identical from one request to the next (prompt caching and
thinking signatures depend on that).

Normalisations, each deterministic so that rebuilding gives the same bytes:
- system and error chunks are never sent; empty text is dropped;
- thinking is kept as it is, even with empty text when it carries a signature,
  redacted data or a Responses reasoning item; a thinking chunk with none of
  them and no text is dropped, and
  so is one marked `interrupted` without either (cut off before it was signed);
- interrupted text is sent as the user saw it;
- a message's files (its `attachments`) become image and document parts before
  its text, references whose bytes the adapters read when they send them;
- tool arguments are re-ordered with sorted keys (PostgreSQL's jsonb re-orders
  keys on its own, which would otherwise change the bytes after a reload);
- call ids are made safe (`[a-zA-Z0-9_-]`) and unique in the request;
- an empty tool result is sent as EMPTY_RESULT; the result of a shell call
  interrupted while it ran is sent after the output it had printed;
- tool results go first in the user message that follows their call; a call
  without a result (a crash) gets a synthetic error result; a result without a
  call is dropped, and so is a tool_result chunk that holds only live output
  (sealed before its result by a cancel, a crash or another tool's output);
- the partial output of a response cut off by an error is dropped when a
  system chunk marked `retry` follows in the same step;
- roles alternate user/assistant starting with user; adjacent messages of one
  role are merged, and a trailing assistant message without tool calls is
  left out (a request must end with the user's side).

Context management (chat/context.py): a request starts at the newest
compaction chunk, with its summary as the first user message, followed by the
chunks after its `through_seq`; the results named by an `elide` system chunk are
sent as one-line sentinels. Both change earlier messages, so a History that is
given one of those chunks incrementally is `stale` and must be built again.

A chunk that no request could hold (an unknown role/type pair, a call without
an id) raises ValueError: it is a bug in whoever wrote the log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple, cast, overload

from chat import context
from chat.chunks import (
    AssistantText,
    Compaction,
    Kind,
    Role,
    SystemKind,
    SystemNotice,
    Thinking,
    ToolCall,
    ToolResult,
    UserText,
)
from chat.providers.base import (
    DocumentPart,
    ImagePart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    upload_path,
)
from chat.stream import ChunkLike

# Anthropic's tool_use id pattern is ^[a-zA-Z0-9_-]+$; OpenAI accepts it too.
UNSAFE_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
# The safe id of a call whose id is empty (some OpenAI-compatible servers).
EMPTY_CALL_ID = "call"
MISSING_RESULT = "No result was recorded for this call (the turn was interrupted)."
# Sent for a tool that printed nothing: some Anthropic routes reject an empty
# tool_result content (anomalyco/opencode#15371), and the model reads it better.
EMPTY_RESULT = "(no output)"
CONVERSATION_START = "(conversation start)"
# What chat.blobs stores: the types an attachment part can be.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg"})
PDF_TYPE = "application/pdf"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def canonical(value: Any) -> Any:
    """The same JSON value with every object's keys sorted."""
    if isinstance(value, Mapping):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


class _Call(NamedTuple):
    original: str  # the id in the log
    safe: str  # the id sent to the provider
    name: str


@dataclass(slots=True)
class _Draft:
    """The message being folded. Never frozen empty: whoever creates one adds a
    part, or gives it calls to answer (synthetic results fill the rest)."""

    role: str
    parts: list[Part] = field(default_factory=list)
    # Assistant: the (turn_id, step) of its last chunk, and its calls in order.
    step: tuple[Any, int] | None = None
    calls: list[_Call] = field(default_factory=list)
    # User: the calls of the assistant message before, and the safe ids answered.
    expects: list[_Call] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)

    def unanswered(self) -> list[_Call]:
        return [c for c in self.expects if c.safe not in self.answered]

    def freeze(self) -> Message:
        parts = self.parts
        missing = self.unanswered()
        if missing:
            at = _results_end(parts)
            synthetic = [ToolResultPart(c.safe, c.name, MISSING_RESULT, True) for c in missing]
            parts = [*parts[:at], *synthetic, *parts[at:]]
        return Message(self.role, tuple(parts))


@dataclass(slots=True)
class History:
    """Folds chunks, in seq order, into request messages."""

    _done: list[Message] = field(default_factory=list)
    _draft: _Draft | None = None
    _used_ids: set[str] = field(default_factory=set)
    # Safe id -> the last suffix tried for it. Servers that reuse one id every
    # step would otherwise make each new call probe all earlier ones.
    _suffixes: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    # Seqs of the tool results sent as sentinels (elide chunks).
    _elided: frozenset[int] = frozenset()
    # A compaction or elide chunk came after the build: the messages are not the
    # log's any more (see the module docstring).
    stale: bool = False

    @classmethod
    def build(cls, chunks: Iterable[ChunkLike]) -> History:
        """The history of a log (or of its tail from the newest compaction chunk on)."""
        chunks = list(chunks)
        history = cls()
        history._elided = frozenset(seq for c in chunks if _is_elide(c) for seq in _seqs(c))
        start = next((c for c in reversed(chunks) if c.type == Kind.COMPACTION), None)
        if start is not None:
            through = _through(start)
            summary: Any = cast(Compaction, start.data).get("summary")
            if not isinstance(summary, str) or not summary.strip():
                raise ValueError(f"compaction chunk {start.seq} has no summary")
            history._to(Role.USER).parts.append(TextPart(context.summary_message(summary)))
            chunks = [c for c in chunks if c.seq is None or c.seq > through]
        for chunk in chunks:
            if chunk.type == Kind.COMPACTION or _is_elide(chunk):
                history._advance(chunk)
            else:
                history.add(chunk)
        return history

    def extend(self, chunks: Iterable[ChunkLike]) -> None:
        for chunk in chunks:
            self.add(chunk)

    def add(self, chunk: ChunkLike) -> None:
        """Fold one more chunk. Raises ValueError on a chunk out of order or unsendable."""
        self._advance(chunk)
        data = chunk.data
        match chunk.role, chunk.type:
            case Role.SYSTEM, Kind.COMPACTION:
                self.stale = True
            case Role.SYSTEM, Kind.SYSTEM if _is_elide(chunk):
                self.stale = True
            case Role.SYSTEM, Kind.SYSTEM if cast(SystemNotice, data).get("retry"):
                self._discard_attempt(chunk)
            case _, Kind.SYSTEM | Kind.ERROR:
                pass  # the UI's, never the model's
            case Role.ASSISTANT, Kind.PLAN:
                # An agent's plan is its progress shown to the user: each revision is a
                # chunk, and the text and calls around them already say what was done.
                # Sending them would repeat the plan at every revision to a model that
                # did not make it; none is sent (ARCHITECTURE.md, "External agents").
                pass
            case Role.USER, Kind.TEXT:
                message = cast(UserText, data)
                # Files before the text that speaks of them (Anthropic's advice).
                parts = attachment_parts(message.get("attachments"))
                if message.get("text"):
                    parts.append(TextPart(message["text"]))
                if parts:
                    self._to(Role.USER).parts.extend(parts)
            case Role.ASSISTANT, Kind.TEXT:
                answer = cast(AssistantText, data)
                if answer.get("text"):
                    self._assistant(chunk).parts.append(TextPart(answer["text"]))
            case Role.ASSISTANT, Kind.THINKING:
                thinking = cast(Thinking, data)
                signature = thinking.get("signature")
                redacted = thinking.get("redacted_data")
                item = thinking.get("reasoning_item")
                # Replayed unmodified: a signature binds the exact text. Thinking
                # cut off before its signature (a stop, a crash, an error) is
                # not sent: Anthropic rejects it, and it is half a thought.
                text = thinking.get("text")
                if signature or redacted or item or (text and not thinking.get("interrupted")):
                    part = ThinkingPart(thinking.get("text", ""), signature, redacted, item)
                    self._assistant(chunk).parts.append(part)
            case Role.ASSISTANT, Kind.TOOL_CALL:
                tool_call = cast(ToolCall, data)
                original = _call_id(chunk)
                name = tool_call.get("name")
                if not isinstance(name, str) or not name:
                    raise ValueError(f"tool_call chunk {chunk.seq} has no tool name")
                draft = self._assistant(chunk)
                call = _Call(original, self._safe_id(original), name)
                draft.calls.append(call)
                args = canonical(tool_call.get("arguments") or {})
                draft.parts.append(ToolCallPart(call.safe, name, args))
            case Role.TOOL, Kind.TOOL_RESULT:
                self._result(chunk)
            case role, kind:
                raise ValueError(f"chunk {chunk.seq}: a {role!r} {kind!r} chunk cannot be sent")

    @property
    def elided(self) -> frozenset[int]:
        """Seqs of the results this history sends as sentinels."""
        return self._elided

    def _advance(self, chunk: ChunkLike) -> None:
        if chunk.seq is not None:
            if chunk.seq <= self.last_seq:
                raise ValueError(f"chunk seq {chunk.seq} is not after {self.last_seq}")
            self.last_seq = chunk.seq

    def messages(self) -> Messages:
        """The request messages for the next step."""
        if self.stale:
            raise RuntimeError("the log was compacted or elided since this history was built")
        draft = self._draft
        if draft is None:
            return Messages(self._done, len(self._done))
        if draft.role == Role.ASSISTANT:
            if not draft.calls:
                return Messages(self._done, len(self._done))
            # Calls with no results yet: answer them so the request is valid.
            answers = _Draft(Role.USER, expects=draft.calls)
            return Messages(self._done, len(self._done), (draft.freeze(), answers.freeze()))
        return Messages(self._done, len(self._done), (draft.freeze(),))

    def open_calls(self) -> list[tuple[str, str]]:
        """(id, name) of the last assistant message's calls that have no result yet: a
        turn resumed after a crash finds the calls it must still answer (sub-agents)."""
        draft = self._draft
        if draft is None:
            return []
        calls = draft.calls if draft.role == Role.ASSISTANT else draft.unanswered()
        return [(call.original, call.name) for call in calls]

    def with_ask(self, text: str) -> list[Message]:
        """The summary request's messages: the live request's, then the answer that
        ended the last turn (which `messages` leaves out), then `text` from the user.
        The live request's messages come first unchanged, so the summary request
        reads the whole conversation from the prompt cache."""
        messages = list(self.messages())
        draft = self._draft
        if draft is not None and draft.role == Role.ASSISTANT and not draft.calls:
            messages.append(draft.freeze())
        messages.append(Message(Role.USER, (TextPart(text),)))
        return messages

    def _discard_attempt(self, chunk: ChunkLike) -> None:
        """A retry notice: the response of this step was cut off and is asked again.

        Its partial output stays in the log (nothing is lost) but is never sent:
        the retry's request must equal the first attempt's, and the retried
        response replaces the partial one (a partial text before the retry's
        thinking would be rejected by Anthropic).
        """
        draft = self._draft
        if (
            draft is not None
            and draft.role == Role.ASSISTANT
            and draft.step
            == (
                chunk.turn_id,
                chunk.step,
            )
        ):
            self._draft = None

    def _assistant(self, chunk: ChunkLike) -> _Draft:
        """The assistant draft for `chunk`'s step."""
        step = (chunk.turn_id, chunk.step)
        draft = self._draft
        if (
            draft is not None
            and draft.role == Role.ASSISTANT
            and draft.calls
            and draft.step != step
        ):
            # Calls left unanswered, then another step: that step's request
            # held them answered by synthetic errors (see messages()), and its
            # thinking signatures are bound to that prefix. Fold it the same way.
            self._to(Role.USER)
        draft = self._to(Role.ASSISTANT)
        draft.step = step
        return draft

    def _to(self, role: str) -> _Draft:
        """The draft message of `role`, finishing the other one."""
        draft = self._draft
        if draft is not None and draft.role == role:
            return draft
        if draft is not None:
            self._done.append(draft.freeze())
        elif role == Role.ASSISTANT and not self._done:
            # A request starts with the user; a log that does not gets a marker.
            self._done.append(Message(Role.USER, (TextPart(CONVERSATION_START),)))
        expects = draft.calls if draft is not None and role == Role.USER else []
        self._draft = _Draft(role, expects=expects)
        return self._draft

    def _result(self, chunk: ChunkLike) -> None:
        data = cast(ToolResult, chunk.data)
        original = _call_id(chunk)
        if "result" not in data:
            # Live output sealed before its result: the result chunk that
            # follows answers the call, or else the synthetic error does.
            return
        draft = self._draft
        if draft is None:
            return
        open_calls = draft.calls if draft.role == Role.ASSISTANT else draft.unanswered()
        # First unanswered call with this id: ids may repeat within a message.
        call = next((c for c in open_calls if c.original == original), None)
        if call is None:
            return  # no such call in the message before: not sendable
        user = self._to(Role.USER)
        user.answered.add(call.safe)
        text = str(data["result"]) or EMPTY_RESULT
        if chunk.seq in self._elided:
            text = context.sentinel(call.name, context.chunk_chars(chunk))
        elif data.get("interrupted") and data.get("shell_output"):
            # Cut short while it ran (a Stop, a crash): its result says only why,
            # and what it printed is all the model can know of what it did, which
            # Continue tells it to look for in the result. As the shell tool's own
            # results are: the output, then a status line in brackets.
            output = str(data["shell_output"])
            if not output.endswith("\n"):
                output += "\n"
            text = f"{output}[{text}]"
        images = tuple(
            p for p in attachment_parts(data.get("attachments")) if isinstance(p, ImagePart)
        )
        part = ToolResultPart(call.safe, call.name, text, bool(data.get("is_error")), images)
        user.parts.insert(_results_end(user.parts), part)

    def _safe_id(self, original: str) -> str:
        safe = UNSAFE_ID_CHARS.sub("_", original) or EMPTY_CALL_ID
        # Suffixes below the remembered one are all taken (ids are never
        # released), so starting there gives the same id as starting at 1.
        n = self._suffixes.get(safe, 1)
        candidate = safe if n == 1 else f"{safe}_{n}"
        while candidate in self._used_ids:
            n += 1
            candidate = f"{safe}_{n}"
        self._suffixes[safe] = n
        self._used_ids.add(candidate)
        return candidate


def _is_elide(chunk: ChunkLike) -> bool:
    return chunk.type == Kind.SYSTEM and chunk.data.get("kind") == SystemKind.ELIDE


def _seqs(chunk: ChunkLike) -> list[int]:
    seqs: Any = cast(SystemNotice, chunk.data).get("seqs")
    if not isinstance(seqs, list):
        return []
    return [s for s in seqs if isinstance(s, int) and not isinstance(s, bool)]


def _through(chunk: ChunkLike) -> int:
    through: Any = cast(Compaction, chunk.data).get("through_seq")
    if not isinstance(through, int) or isinstance(through, bool) or through < 0:
        raise ValueError(f"compaction chunk {chunk.seq} has no valid through_seq")
    if chunk.seq is not None and through >= chunk.seq:
        raise ValueError(f"compaction chunk {chunk.seq} summarises through a later seq")
    return through


def attachment_parts(refs: Any) -> list[Part]:
    """The parts of a chunk's `attachments` (chat.blobs.reference dicts); an entry that
    is not one (an edited import) is left out. A tool's image carries the workspace
    `path` it was read from; a message's file is at its upload_path."""
    parts: list[Part] = []
    for ref in refs if isinstance(refs, list) else ():
        if not isinstance(ref, Mapping) or not SHA256_HEX.fullmatch(str(ref.get("sha256"))):
            continue
        sha, name, mime = ref["sha256"], str(ref.get("name") or "attachment"), ref.get("mime")
        path = str(ref.get("path") or upload_path(sha, name))
        if mime in IMAGE_TYPES:
            parts.append(
                ImagePart(
                    sha, name, mime, _count(ref.get("width")), _count(ref.get("height")), path
                )
            )
        elif mime == PDF_TYPE:
            size, pages = _count(ref.get("size")), _count(ref.get("pages"))
            parts.append(DocumentPart(sha, name, mime, size, pages, path))
    return parts


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _call_id(chunk: ChunkLike) -> str:
    call_id: Any = cast(ToolCall | ToolResult, chunk.data).get("call_id")
    if not isinstance(call_id, str):
        raise ValueError(f"{chunk.type} chunk {chunk.seq} has no call_id")
    return call_id


class Messages(Sequence[Message]):
    """An immutable view of a request's messages: a prefix of the (append-only)
    finished messages plus the draft's, without copying the prefix.

    Copying would make every step cost the tab's length; the view costs what
    the step added. Compares equal to any sequence of the same messages.
    """

    __slots__ = ("_done", "_n", "_tail")

    def __init__(self, done: list[Message], n: int, tail: tuple[Message, ...] = ()) -> None:
        self._done, self._n, self._tail = done, n, tail

    def __len__(self) -> int:
        return self._n + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        length = len(self)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("message index out of range")
        return self._done[index] if index < self._n else self._tail[index - self._n]

    def __iter__(self) -> Iterator[Message]:
        yield from islice(self._done, self._n)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Messages({list(self)!r})"


def _results_end(parts: list[Part]) -> int:
    i = 0
    while i < len(parts) and isinstance(parts[i], ToolResultPart):
        i += 1
    return i


def build(chunks: Iterable[ChunkLike]) -> Messages:
    """The request messages for a whole log (cold build)."""
    return History.build(chunks).messages()
