"""Continue: what to tell the model about a turn that did not finish.

Pure: no Django imports. Chunks are anything with `seq, turn_id, step, role,
type, data`.

A bare "continue" gets "no response requested" from models (ARCHITECTURE.md,
Branches and continue): the new turn's first message says exactly what was
interrupted and where. The request rules that go with it are history's
(interrupted text is sent as the user saw it; interrupted thinking without a
signature is not sent) and the runner's and recovery's (an interrupted call has
an `is_error` result and is never run again by itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from chat.chunks import (
    AssistantText,
    Error,
    Kind,
    Role,
    SystemKind,
    SystemNotice,
    ToolCall,
    ToolResult,
)
from chat.stream import ChunkLike

NOTHING = "Nothing to continue: the last turn finished normally."
EMPTY = "Nothing to continue: this tab has no turn yet."
# How much of an interrupted text the message quotes, to say where it stopped.
QUOTE_CHARS = 160
# How much of a tool call's command or path names it.
CALL_CHARS = 120
# The argument that says what a call does, in order of preference.
CALL_KEYS = ("command", "cmd", "path", "file", "query", "url", "pattern", "name")

# What each way of ending says: each of SystemKind.ENDINGS, and an error chunk.
ENDINGS = {
    SystemKind.INTERRUPTED: "The server restarted in the middle of your previous reply.",
    SystemKind.CANCELLED: "I stopped your previous reply.",
    SystemKind.OUTPUT_LIMIT: "Your previous reply was cut off at the output limit.",
    SystemKind.CONTEXT_LIMIT: (
        "Your previous reply stopped because the conversation filled your context window."
    ),
    SystemKind.STEP_LIMIT: "Your previous reply stopped at the step limit.",
    Kind.ERROR: "Your previous reply stopped on an error: {message}",
}
GO_ON = "Continue the task from where it stopped, without repeating what you already wrote."
# Said when a call was cut short: its effects are unknown, so it is not re-run blindly.
NOT_AGAIN = "Do not run an interrupted call again unless you know it is safe to."


def ending(turn: Sequence[ChunkLike]) -> ChunkLike | None:
    """The chunk that cut `turn` (the chunks of the tab's last turn, in seq order) short:
    its error, or its notice of a kind in SystemKind.ENDINGS; None when it finished normally."""
    for chunk in reversed(turn):
        if chunk.type == Kind.ERROR:
            return chunk
        if chunk.type == Kind.SYSTEM:
            if cast(SystemNotice, chunk.data).get("kind") in SystemKind.ENDINGS:
                return chunk
            continue  # a notice, a config reload: look further back
        return None
    return None


def interruption(turn: Sequence[ChunkLike]) -> str | None:
    """How `turn` was cut short: a key of ENDINGS, or None when it finished normally."""
    chunk = ending(turn)
    if chunk is None:
        return None
    return Kind.ERROR if chunk.type == Kind.ERROR else cast(SystemNotice, chunk.data)["kind"]


def message(turn: Sequence[ChunkLike]) -> str:
    """The user message that continues `turn`. Raises ValueError (for the user)
    when there is nothing to continue."""
    if not turn:
        raise ValueError(EMPTY)
    kind = interruption(turn)
    if kind is None:
        raise ValueError(NOTHING)
    error = next((c for c in reversed(turn) if c.type == Kind.ERROR), None)
    ending = ENDINGS[kind].format(
        message=(cast(Error, error.data).get("message") or "").strip().rstrip(".") + "."
        if error
        else ""
    )
    where, calls_cut = _where(turn)
    advice = f"{GO_ON} {NOT_AGAIN}" if calls_cut else GO_ON
    return " ".join(filter(None, [ending, where])) + "\n\n" + advice


def _where(turn: Sequence[ChunkLike]) -> tuple[str, bool]:
    """What was going on when the turn stopped (the calls that were cut short, or
    the end of the text being written), and whether a call was cut short."""
    last = None
    for chunk in reversed(turn):
        if chunk.type in (Kind.SYSTEM, Kind.ERROR):
            continue
        last = chunk
        break
    if last is None or last.role == Role.USER:
        return "You had not written anything yet.", False
    if last.type == Kind.TOOL_RESULT:
        calls = _interrupted_calls(turn)
        return (calls, True) if calls else ("Its last tool results are above.", False)
    if last.type == Kind.TEXT:
        text = cast(AssistantText, last.data).get("text", "")
        return f"You were writing; your text ends with: “{_tail(text)}”", False
    if last.type == Kind.THINKING:
        return "You were thinking (that thinking is lost).", False
    if last.type == Kind.TOOL_CALL:
        return f"It stopped right after you called {_call(cast(ToolCall, last.data))}.", True
    return "", False


def _interrupted_calls(turn: Sequence[ChunkLike]) -> str:
    """The calls of the last step that were cut short: the one running, and the
    ones never run."""
    step = max((c.step for c in turn if c.type == Kind.TOOL_RESULT), default=0)
    results = [
        c
        for c in turn
        if c.type == Kind.TOOL_RESULT
        and c.step == step
        and cast(ToolResult, c.data).get("interrupted")
    ]
    calls = {
        cast(ToolCall, c.data).get("call_id"): c.data for c in turn if c.type == Kind.TOOL_CALL
    }
    sentences = []
    for result in results:
        data = cast(ToolResult, result.data)
        call = _call(calls.get(data.get("call_id"), result.data))
        if "shell_output" in data:
            sentences.append(
                f"{call} was running: its exit status is unknown, and its output so far "
                "is in its result."
            )
        else:
            sentences.append(f"{call} was not run.")
    return " ".join(sentences)


def _call(data: Mapping[str, Any]) -> str:
    """A call named as the model would recognise it (its result names the call when the
    call itself is not in the turn)."""
    name = str(data.get("name") or "a tool")
    arguments = data.get("arguments")
    args: Mapping[str, Any] = arguments if isinstance(arguments, dict) else {}
    for key in CALL_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            value = " ".join(value.split())
            if len(value) > CALL_CHARS:
                value = value[: CALL_CHARS - 1] + "…"
            return f"`{name}: {value}`"
    return f"`{name}`"


def _tail(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= QUOTE_CHARS:
        return text
    return "…" + text[-QUOTE_CHARS:]
