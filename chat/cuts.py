"""Where a tab's log can be cut for a branch (and so for edit, regenerate and retry).

Pure: no Django imports. Chunks are anything with `seq, turn_id, step, role,
type, data` (a `chat.models.Chunk` or a `chat.stream.Block`).

A cut at seq N keeps the chunks with seq <= N. It is valid where the log is a
complete history the model could be asked to go on from (ARCHITECTURE.md, Branches and continue):

- right before a user chunk (N = 0 when the first chunk is the user's),
- right after a user chunk (the question, to be answered again), or
- at the end of a step (the next chunk is of another step, or there is none)
  whose tool calls all have results at or before N.

System chunks belong to the step the runner wrote them in: a step ends after
its notices (a `retry` notice is in the middle of its step, since the attempt
after it is the same step).

Never inside the turn that is running: its chunks are not final yet.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, cast

from chat.chunks import Kind, Role, ToolCall, ToolResult
from chat.stream import ChunkLike


class CutError(ValueError):
    """A cut that cannot be made; the message says why, for the user."""


class TurnRunning(CutError):
    """The cut is in the turn that is running: not wrong, only not yet possible."""


NO_SUCH_CHUNK = "There is no message {seq} in this tab."
EMPTY = "This tab is empty: there is nothing to branch from."
RUNNING = "That point is in the turn that is running. Stop it or wait for it to end, then branch."
MID_STEP = (
    "A branch can start right before one of your messages, or after a step of the "
    "answer has finished (with its tool results): not in the middle of a step."
)
UNANSWERED = "A tool call there has no result yet: branch after its result."


def check(
    at_seq: int,
    at: ChunkLike | None,
    after: ChunkLike | None,
    turn: Sequence[ChunkLike],
    *,
    running_turn: uuid.UUID | None = None,
) -> None:
    """Raise CutError unless a cut at `at_seq` is valid.

    `at` is the chunk at `at_seq` (None when at_seq is 0 or there is none),
    `after` the chunk right after it (None at the end of the log), and `turn`
    the chunks of `at`'s turn up to and including `at`.
    """
    if at_seq < 0 or (at is None and at_seq != 0):
        raise CutError(NO_SUCH_CHUNK.format(seq=at_seq))
    if at is None:
        if after is None:
            raise CutError(EMPTY)
        if not _is_user(after):
            raise CutError(MID_STEP)
        return
    if running_turn is not None and at.turn_id == running_turn:
        raise TurnRunning(RUNNING)
    if after is not None and _is_user(after):
        return
    if _mid_step(at, after):
        raise CutError(MID_STEP)
    if unanswered(turn):
        raise CutError(UNANSWERED)


def is_valid(
    at_seq: int,
    at: ChunkLike | None,
    after: ChunkLike | None,
    turn: Sequence[ChunkLike],
    *,
    running_turn: uuid.UUID | None = None,
) -> bool:
    try:
        check(at_seq, at, after, turn, running_turn=running_turn)
    except CutError:
        return False
    return True


def valid_cuts(chunks: Sequence[ChunkLike], *, running_turn: uuid.UUID | None = None) -> set[int]:
    """The seqs of `chunks` (consecutive, in seq order) that are valid cuts, given
    that each chunk's turn starts within `chunks` or before a valid cut.

    For marking a page: a turn cut off at the page's top counts its calls from
    the page's first chunk, so a page should start at a turn's start to be exact.
    The server checks every cut again (`check`); a wrong mark is a refused click.
    """
    found: set[int] = set()
    waiting: dict[Any, list[str]] = {}  # turn -> its calls without a result so far
    for i, chunk in enumerate(chunks):
        after = chunks[i + 1] if i + 1 < len(chunks) else None
        in_running = running_turn is not None and chunk.turn_id == running_turn
        if i == 0 and _is_user(chunk) and chunk.seq is not None and not in_running:
            found.add(chunk.seq - 1)
        calls = waiting.setdefault(chunk.turn_id, [])
        _answer(calls, chunk)
        if in_running:
            continue
        before_user = after is not None and _is_user(after)
        if before_user or (not _mid_step(chunk, after) and not calls):
            # A page's chunks are log rows: each has its seq.
            found.add(cast(int, chunk.seq))
    return found


def unanswered(turn: Sequence[ChunkLike]) -> list[str]:
    """Call ids of the tool calls in `turn` that no result answers (in call order)."""
    waiting: list[str] = []
    for chunk in turn:
        _answer(waiting, chunk)
    return waiting


def _answer(waiting: list[str], chunk: ChunkLike) -> None:
    """Fold one chunk into the calls waiting for a result: a call joins them, a
    result answers the first with its id (ids may repeat); live output answers none."""
    if chunk.type == Kind.TOOL_CALL:
        waiting.append(cast(ToolCall, chunk.data).get("call_id"))
    elif chunk.type == Kind.TOOL_RESULT and "result" in chunk.data:
        call_id = cast(ToolResult, chunk.data).get("call_id")
        if call_id in waiting:
            waiting.remove(call_id)


def regenerate_at(turn: Sequence[ChunkLike]) -> int:
    """The cut that asks a turn's question again: right after the user's
    messages that start it. Raises CutError for a turn that starts otherwise."""
    last = None
    for chunk in turn:
        if not _is_user(chunk):
            break
        last = chunk.seq
    if last is None:
        raise CutError("This answer has no message of yours before it to answer again.")
    return last


def retry_at(turn: Sequence[ChunkLike], error_seq: int) -> int:
    """The cut that retries the step an error ended: the last valid cut of the
    turn before the error (after the last finished step, else right after the
    user's messages), so finished tool work is kept and not run again."""
    before = [c for c in turn if c.seq is not None and c.seq < error_seq]
    best = None
    for i, chunk in enumerate(before):
        after = before[i + 1] if i + 1 < len(before) else None
        if after is None:
            # The chunk before the error: a cut here keeps the failed step's start
            # unless the error came at a step's very beginning.
            after = next((c for c in turn if c.seq == error_seq), None)
        # `before` holds only chunks with a seq.
        if is_valid(cast(int, chunk.seq), chunk, after, before[: i + 1]):
            best = chunk.seq
    if best is None:
        raise CutError("There is nothing before this error to try again from.")
    return best


def _is_user(chunk: ChunkLike) -> bool:
    return chunk.role == Role.USER and chunk.type == Kind.TEXT


def _mid_step(at: ChunkLike, after: ChunkLike | None) -> bool:
    """`after` goes on the step `at` is in (a user chunk ends its own step)."""
    return (
        after is not None
        and at.turn_id is not None
        and not _is_user(at)
        and (after.turn_id, after.step) == (at.turn_id, at.step)
    )
