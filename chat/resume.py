"""Continue: what to tell the model about a turn that did not finish.

Pure: no Django imports. Chunks are anything with `seq, turn_id, step, role,
type, data`.

A bare "continue" gets "no response requested" from models (DESIGN §11): the
new turn's first message says exactly what was interrupted and where. The
request rules that go with it are history's (interrupted text is sent as the
user saw it; interrupted thinking without a signature is not sent) and the
runner's and recovery's (an interrupted call has an `is_error` result and is
never run again by itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from chat.stream import Kind, Role


class ChunkLike(Protocol):
    seq: int | None
    turn_id: Any
    step: int
    role: str
    type: str
    data: dict[str, Any]


NOTHING = "Nothing to continue: the last turn finished normally."
EMPTY = "Nothing to continue: this tab has no turn yet."
# How much of an interrupted text the message quotes, to say where it stopped.
QUOTE_CHARS = 160
# How much of a tool call's command or path names it.
CALL_CHARS = 120
# The argument that says what a call does, in order of preference.
CALL_KEYS = ("command", "cmd", "path", "file", "query", "url", "pattern", "name")

# What each way of ending says, and what to do next. {where} is filled in below.
ENDINGS = {
    "interrupted": "The server restarted in the middle of your previous reply{where}.",
    "cancelled": "I stopped your previous reply{where}.",
    "output-limit": "Your previous reply was cut off at the output limit{where}.",
    "context-limit": (
        "Your previous reply stopped because the conversation filled your context window{where}."
    ),
    "step-limit": "Your previous reply stopped at the step limit{where}.",
    "error": "Your previous reply stopped on an error{where}: {message}",
}
GO_ON = (
    "Continue the task from where it stopped. Do not repeat what you already wrote, and "
    "do not run an interrupted command again unless you know it is safe to."
)


def interruption(turn: Sequence[ChunkLike]) -> str | None:
    """How `turn` (the chunks of the tab's last turn, in seq order) was cut short:
    a key of ENDINGS, or None when it finished normally."""
    for chunk in reversed(turn):
        if chunk.type == Kind.ERROR:
            return "error"
        if chunk.type == Kind.SYSTEM:
            kind = chunk.data.get("kind")
            if kind in ENDINGS:
                return kind
            continue  # a notice, a config reload: look further back
        return None
    return None


def message(turn: Sequence[ChunkLike]) -> str:
    """The user message that continues `turn`. Raises ValueError (for the user)
    when there is nothing to continue."""
    if not turn:
        raise ValueError(EMPTY)
    kind = interruption(turn)
    if kind is None:
        raise ValueError(NOTHING)
    where = _where(turn)
    error = next((c for c in reversed(turn) if c.type == Kind.ERROR), None)
    text = ENDINGS[kind].format(
        where=where, message=(error.data.get("message") or "").strip() if error else ""
    )
    return f"{text}\n\n{GO_ON}"


def _where(turn: Sequence[ChunkLike]) -> str:
    """What was going on when the turn stopped: the call that was running, or
    the end of the text being written. "" when neither can be told."""
    last = None
    for chunk in reversed(turn):
        if chunk.type in (Kind.SYSTEM, Kind.ERROR):
            continue
        last = chunk
        break
    if last is None or last.role == Role.USER:
        return ", before you had written anything"
    if last.type == Kind.TOOL_RESULT:
        calls = _interrupted_calls(turn)
        if calls:
            return calls
        return ", after the tool results above"
    if last.type == Kind.TEXT:
        return f", while you were writing. It ends with: “{_tail(last.data.get('text', ''))}”"
    if last.type == Kind.THINKING:
        return ", while you were thinking (that thinking is lost)"
    if last.type == Kind.TOOL_CALL:
        return f", right after you called {_call(last.data)}"
    return ""


def _interrupted_calls(turn: Sequence[ChunkLike]) -> str:
    """The calls of the last step that were cut short: the one running, and the
    ones never run."""
    step = max((c.step for c in turn if c.type == Kind.TOOL_RESULT), default=0)
    results = [
        c
        for c in turn
        if c.type == Kind.TOOL_RESULT and c.step == step and c.data.get("interrupted")
    ]
    if not results:
        return ""
    calls = {c.data.get("call_id"): c.data for c in turn if c.type == Kind.TOOL_CALL}
    ran = [r for r in results if "shell_output" in r.data]
    never = [r for r in results if "shell_output" not in r.data]
    parts = []
    for result in ran:
        call = calls.get(result.data.get("call_id"), result.data)
        parts.append(
            f" while {_call(call)} was running: its exit status is unknown, "
            "and its output so far is in its result"
        )
    if never:
        names = ", ".join(_call(calls.get(r.data.get("call_id"), r.data)) for r in never)
        parts.append(f" before {names} ran (not run)")
    return ",".join(parts)


def _call(data: dict[str, Any]) -> str:
    name = str(data.get("name") or "a tool")
    args = data.get("arguments") if isinstance(data.get("arguments"), dict) else {}
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
