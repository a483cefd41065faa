"""PURE: the one way a turn ends. Whoever ends it (its runner, lease recovery after a
dead worker, a parent stopping a child that never started, Stop) feeds the turn's
reducer the same ops: the open block sealed as it is and marked `interrupted`, every
call without a result answered (the running one saying it ran), then the chunk that
says how the turn ended. A hand-built copy of this drifts.

How a turn ends (`Ending`) and what its last chunk is:

- DONE: the model answered without calling a tool; nothing more is written.
- ERROR: an error chunk (a provider error given up on, a crash).
- CANCELLED: a `cancelled` notice (the user's Stop, or a parent's, saying why).
- INTERRUPTED: an `interrupted` notice (a worker shut down or died mid-turn).
- LIMIT: a notice of the limit (`step-limit`).

`End.kind` is the notice's SystemKind (chat.chunks), one of SystemKind.ENDINGS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from chat.chunks import Kind, SystemKind
from chat.providers.base import ErrorEvent, SystemEvent, ToolResultEvent
from chat.stream import Block, Op, Reducer, Seal


class Ending(StrEnum):
    DONE = "done"
    ERROR = "error"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    LIMIT = "limit"


# The result of calls a crashed turn never ran, and of the one it was running.
NOT_RUN_CRASHED = "Not run: the turn stopped on an internal error."
CRASHED_WHILE_RUNNING = "Interrupted: the turn stopped on an internal error while this call ran."
# The same for a turn given up on a provider's error, or on a response not read.
NOT_RUN_ERROR = "Not run: the response was cut off by an error."
NOT_RUN_UNREADABLE = "Not run: the response could not be read."
# The same for a turn whose worker shut down, and one recovered after its worker died.
NOT_RUN_SHUTDOWN = "Interrupted: the worker running this turn shut down."
NOT_RUN_RECOVERED = "Not run to completion: the server stopped during this call."
RECOVERED_WHILE_RUNNING = "Interrupted: the server stopped while this call ran."
# What a recovered (or shut down) turn whose sub-agents run on says: it goes on by itself.
RESUMING = " Its sub-agents are still running: the turn goes on to wait for them."


@dataclass(frozen=True)
class End:
    """How a turn ends: `how`, the last chunk's text (an error's message), what calls
    left without a result are answered (`not_run`; `running` for the call whose output
    was streaming), and, for an error, its status code and details."""

    how: Ending
    text: str = ""
    not_run: str = ""
    running: str | None = None
    kind: str = ""
    status_code: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def stopped(cls, why: str = "") -> End:
        """Stop: the user's, or (`why`) a parent's or a cap's."""
        kind = SystemKind.CANCELLED
        if why:
            return cls(Ending.CANCELLED, f"Stopped: {why}.", f"Stopped: {why}.", kind=kind)
        return cls(Ending.CANCELLED, "Stopped by the user.", "Cancelled by the user.", kind=kind)

    @classmethod
    def stopped_before_start(cls, why: str = "") -> End:
        """A sub-agent's prompt no worker took yet, stopped."""
        text = f"Stopped before it started: {why}." if why else ""
        return cls(
            Ending.CANCELLED,
            text or "Stopped by the user before it started.",
            kind=SystemKind.CANCELLED,
        )

    @classmethod
    def shut_down(cls, *, resuming: bool) -> End:
        text = "The server shut down in the middle of this turn. " + (
            RESUMING.strip() if resuming else "Send a message to go on."
        )
        return cls(Ending.INTERRUPTED, text, NOT_RUN_SHUTDOWN, kind=SystemKind.INTERRUPTED)

    @classmethod
    def recovered(cls, *, checkpoint_lost: bool, resuming: bool) -> End:
        """A turn whose worker died, closed by lease recovery."""
        text = "The server stopped in the middle of this turn."
        if checkpoint_lost:
            text += " The last block was saved up to its last checkpoint (at most a second lost)."
        if resuming:
            text += RESUMING
        return cls(
            Ending.INTERRUPTED,
            text,
            NOT_RUN_RECOVERED,
            RECOVERED_WHILE_RUNNING,
            kind=SystemKind.INTERRUPTED,
        )

    @classmethod
    def crashed(cls, message: str) -> End:
        return cls(Ending.ERROR, message, NOT_RUN_CRASHED, CRASHED_WHILE_RUNNING)

    @classmethod
    def error(
        cls,
        message: str,
        not_run: str,
        status_code: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> End:
        return cls(Ending.ERROR, message, not_run, status_code=status_code, details=details or {})

    @classmethod
    def limit(cls, kind: str, text: str) -> End:
        return cls(Ending.LIMIT, text, kind=kind)


def sealed(ops: list[Op]) -> list[Block]:
    """The blocks these ops seal, in order (what goes into the log)."""
    return [op.block for op in ops if isinstance(op, Seal)]


def last_sealed(ops: list[Op]) -> Block:
    """The block the last op seals: a single event's own block (a result, a notice)."""
    last = ops[-1]
    if not isinstance(last, Seal):
        raise TypeError(f"not a seal: {last!r}")
    return last.block


def interrupt_ops(reducer: Reducer, why: str, *, running_why: str | None = None) -> list[Op]:
    """Close a step cut short: the open block sealed as it is and marked `interrupted`
    (history does not send unsigned thinking cut off so; Continue says where it
    stopped), unless it is the running call's output, which its result completes; every
    call without a result answered with `why` (the running one with `running_why`),
    marked too. An interrupted call is never run again by itself."""
    ops: list[Op] = []
    block = reducer.open
    if block is not None and block.type == Kind.TOOL_RESULT:
        # The running call is answered first, into its output block: answering an
        # earlier call first would seal that block without a result, and its id may
        # repeat an answered call's (then it is not pending at all).
        call_id, name = str(block.data.get("call_id", "")), str(block.data.get("name", ""))
        result = reducer.feed(ToolResultEvent(call_id, name, running_why or why, True))
        ran = last_sealed(result)
        ran.data["interrupted"] = True
        # The reducer drops an empty output; kept, it says the call ran.
        ran.data.setdefault("shell_output", "")
        ops += result
    elif block is not None:
        ops += reducer.seal(interrupted=True)
    for call_id, name in list(reducer.pending_calls):
        result = reducer.feed(ToolResultEvent(call_id, name, why, True))
        last_sealed(result).data["interrupted"] = True
        ops += result
    return ops + reducer.seal(interrupted=True)


def end_ops(reducer: Reducer, end: End) -> list[Op]:
    """Every op that ends the reducer's turn as `end` says."""
    if end.how == Ending.DONE:
        return []
    ops = interrupt_ops(reducer, end.not_run, running_why=end.running) if end.not_run else []
    if end.how == Ending.ERROR:
        return ops + reducer.feed(ErrorEvent(end.text, end.status_code, end.details or None))
    return ops + reducer.feed(SystemEvent(end.kind, end.text))
