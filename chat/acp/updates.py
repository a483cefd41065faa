"""PURE: an ACP agent's `session/update` notifications -> the reducer's events
(chat.providers.base), one `Updates` per prompt.

- agent_message_chunk -> TextDelta, agent_thought_chunk -> ReasoningDelta (text blocks;
  an image or a resource the agent shows is left out, logged at debug);
- tool_call -> ToolCallEvent, once its input is known: Claude Code sends `tool_call` twice
  per call, first with an empty `rawInput`, so a call without input is held (updated in
  place by what follows) until its input comes, it starts running, it asks permission or
  the prompt ends. A command (`kind` execute) becomes Dispatch's own `shell` call, so the
  tab's shell rules judge it and "always allow" offers `shell(<command>)`;
- tool_call_update -> ShellOutput while it runs (ACP re-sends the whole `content` each
  time: only what extends what was shown goes out), ToolResultEvent on completed/failed;
- plan -> PlanEvent, when the entries changed (ACP sends the whole plan each time): each
  revision is a chunk of its own, so a prompt logs at most PLAN_MAX_REVISIONS (later
  ones are held, the last logged at the prompt's end) and their text counts against
  its budget;
- usage_update -> kept for the driver (`context`, `cost`); the prompt response's usage
  -> `usage()`; anything else (available_commands_update, current_mode_update,
  user_message_chunk: a replay never reaches here) -> nothing, logged at debug.

Bounded, whatever the agent sends (seed 003): one update contributes at most
FRAME_MAX_CHARS of text, a prompt's text, thinking and live output together at most
PROMPT_BUDGET_CHARS (past it, one notice and nothing more streams), a call's live output
at most CALL_OUTPUT_MAX_CHARS, its stored input at most INPUT_MAX_CHARS of JSON (a
`rawInput` re-sent with every update is read once the call is emitted, never again), its
result at most RESULT_MAX_CHARS (head and tail), a prompt CALLS_MAX calls, a plan
PLAN_MAX_ENTRIES entries of PLAN_ENTRY_CHARS, a prompt PLAN_MAX_REVISIONS + 1 plans.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from acp.schema import (
    AgentMessageChunk,
    AgentPlanRemovedUpdate,
    AgentPlanUpdate,
    AgentThoughtChunk,
    ContentToolCallContent,
    FileEditToolCallContent,
    PermissionOption,
    PromptResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UsageUpdate,
)

from chat.chunks import SystemKind
from chat.providers.base import (
    Event,
    PlanEvent,
    ReasoningDelta,
    ShellOutput,
    SystemEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)

logger = logging.getLogger(__name__)

# The most one update contributes (a message chunk, the new part of a call's output).
FRAME_MAX_CHARS: Final = 64 * 1024
# Everything a prompt streams (text, thinking, live output): past it, the rest is left out.
PROMPT_BUDGET_CHARS: Final = 4 * 1024 * 1024
# A call's live output: the shell tool's own cap (chat.tools.shell.OUTPUT_CAP).
CALL_OUTPUT_MAX_CHARS: Final = 64 * 1024
# A call's input as stored in its chunk (JSON), and the most of one string in it.
INPUT_MAX_CHARS: Final = 16 * 1024
INPUT_STRING_CHARS: Final = 2 * 1024
# A call's result: its head and tail kept, as the shell keeps its output's.
RESULT_MAX_CHARS: Final = 64 * 1024
# The calls of one prompt the log shows: past it, one notice (an agent gone round in circles).
CALLS_MAX: Final = 1000
PLAN_MAX_ENTRIES: Final = 100
PLAN_ENTRY_CHARS: Final = 1000
# Revisions of the plan one prompt logs as they come (Claude Code revises its todo list
# about twice per item: a long task's is a few dozen); past it, one notice and only the
# last revision, at the prompt's end.
PLAN_MAX_REVISIONS: Final = 50

SHELL: Final = "shell"
# A tool name the page and rules can use (rules' own name pattern).
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# argv[0] of a command that runs its `-c` string: the string is the command.
_SHELLS: Final = frozenset({"bash", "sh", "zsh", "dash"})
_DONE: Final = frozenset({"completed", "failed"})

BUDGET_NOTICE: Final = (
    "The agent's output passed {chars} characters in this turn: the rest of its text, "
    "live output and plan is left out of the log."
)
CALLS_NOTICE: Final = (
    "The agent made more than {count} tool calls in this turn: the rest are left out of the log."
)
PLAN_NOTICE: Final = (
    "The agent revised its plan more than {count} times in this turn: only its last "
    "revision is logged, at the turn's end."
)
NO_RESULT: Final = "The agent reported no result for this call."
EMPTY_RESULT: Final = "(no output)"


@dataclass
class _Call:
    call_id: str
    title: str = ""
    kind: str = ""
    tool: str = ""  # the agent's own name for its tool (Claude Code's _meta), if given
    raw_input: Any = None
    emitted: bool = False
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    # The live output shown so far (what the next update's content must extend).
    shown: str = ""
    live_stopped: bool = False


@dataclass
class Updates:
    """One prompt's mapping: feed each update, then `finish` with the response."""

    _calls: dict[str, _Call] = field(default_factory=dict)
    _spent: int = 0
    _over_budget: bool = False
    _calls_over: bool = False
    # The last plan revision seen, the last logged, the revisions logged, and one held
    # past PLAN_MAX_REVISIONS (logged at the end).
    _plan: tuple[tuple[tuple[tuple[str, str], ...], ...], int] | None = None
    _plan_logged: PlanEvent | None = None
    _plans: int = 0
    _plan_held: PlanEvent | None = None
    # usage_update's: tokens in the agent's context and its window; the cost so far.
    context: tuple[int, int] | None = None
    cost: tuple[float, str] | None = None

    def feed(self, update: object) -> list[Event]:
        match update:
            case AgentMessageChunk(content=TextContentBlock(text=text)):
                return self._stream(TextDelta, text)
            case AgentThoughtChunk(content=TextContentBlock(text=text)):
                return self._stream(ReasoningDelta, text)
            case ToolCallStart():
                return self._start(update)
            case ToolCallProgress():
                return self._progress(update)
            case AgentPlanUpdate(entries=entries):
                return self._revise(entries)
            case AgentPlanRemovedUpdate():
                return self._revise([]) if self._plan is not None else []
            case UsageUpdate(used=used, size=size, cost=cost):
                self.context = (used, size)
                if cost is not None:
                    self.cost = (cost.amount, cost.currency)
                return []
        logger.debug("ACP update left out: %r", type(update).__name__)
        return []

    # --- text and thinking ----------------------------------------------------------

    def _stream(self, kind: type[TextDelta] | type[ReasoningDelta], text: str) -> list[Event]:
        taken, notice = self._take(text)
        events: list[Event] = [kind(taken)] if taken else []
        return events + notice

    def _take(self, text: str) -> tuple[str, list[Event]]:
        """What of `text` fits this frame and the prompt's budget; a notice the first time
        the budget runs out."""
        if self._over_budget:
            return "", []
        if len(text) > FRAME_MAX_CHARS:
            left = len(text) - FRAME_MAX_CHARS
            text = text[:FRAME_MAX_CHARS] + f"\n[... {left} characters left out ...]\n"
        room = PROMPT_BUDGET_CHARS - self._spent
        if len(text) <= room:
            self._spent += len(text)
            return text, []
        return text[:room], self._spent_all()

    def _spent_all(self) -> list[Event]:
        self._over_budget = True
        return [SystemEvent(SystemKind.NOTICE, BUDGET_NOTICE.format(chars=PROMPT_BUDGET_CHARS))]

    # --- tool calls -----------------------------------------------------------------

    def _call(self, call_id: str) -> _Call | None:
        """The call of this id, tracked from its first update; None past CALLS_MAX."""
        call = self._calls.get(call_id)
        if call is None and len(self._calls) < CALLS_MAX:
            call = self._calls[call_id] = _Call(call_id)
        return call

    def _too_many(self) -> list[Event]:
        """A call past the cap: left out, and the log says so once."""
        if self._calls_over:
            return []
        self._calls_over = True
        return [SystemEvent(SystemKind.NOTICE, CALLS_NOTICE.format(count=CALLS_MAX))]

    def _merge(self, call: _Call, update: ToolCallStart | ToolCallUpdate) -> None:
        """What an update says of a call not yet emitted: it is updated in place."""
        if update.title:
            call.title = update.title
        if update.kind:
            call.kind = update.kind
        tool = _meta_tool(update.field_meta)
        if tool:
            call.tool = tool
        if _given(update.raw_input):
            call.raw_input = update.raw_input

    def _start(self, update: ToolCallStart) -> list[Event]:
        call = self._call(update.tool_call_id)
        if call is None:
            return self._too_many()
        # A call's own content describes it (Claude Code: the command's description);
        # output comes in its updates, and only its final state counts here.
        content = update.content if update.status in _DONE else None
        if call.emitted:
            # Sent again (Claude Code): only its end would add to what was shown.
            return self._running(call, update.status, content, update.raw_output)
        self._merge(call, update)
        if not _given(call.raw_input) and update.status not in ("in_progress", *_DONE):
            return []  # its input comes in the next tool_call or update
        return self._emit(call) + self._running(call, update.status, content, None)

    def _progress(self, update: ToolCallUpdate) -> list[Event]:
        call = self._call(update.tool_call_id)
        if call is None:
            return self._too_many()
        events: list[Event] = []
        if not call.emitted:
            self._merge(call, update)
            if not (
                _given(call.raw_input) or update.status in ("in_progress", *_DONE) or update.content
            ):
                return []
            events += self._emit(call)
        return events + self._running(call, update.status, update.content, update.raw_output)

    def call(self, tool_call: ToolCallUpdate) -> tuple[list[Event], str, str, dict[str, Any]]:
        """A permission request's call: emitted now if it was not (the approval's card
        must be on the page), with its id, name and arguments for the rules."""
        call = self._call(tool_call.tool_call_id)
        if call is None:
            # Past the cap: judged all the same (by what it asks), never shown.
            call = _Call(tool_call.tool_call_id)
            self._merge(call, tool_call)
            call.name, call.arguments = _identity(call)
            return self._too_many(), call.call_id, call.name, call.arguments
        events: list[Event] = []
        if not call.emitted:
            self._merge(call, tool_call)
            events = self._emit(call)
        return events, call.call_id, call.name, call.arguments

    def _emit(self, call: _Call) -> list[Event]:
        call.emitted = True
        call.name, call.arguments = _identity(call)
        call.raw_input = None  # read once: never kept, never read again
        title = call.title[:500]
        return [ToolCallEvent(call.call_id, call.name, dict(call.arguments), title=title)]

    def _running(
        self, call: _Call, status: str | None, content: Sequence[Any] | None, raw_output: Any
    ) -> list[Event]:
        if call.done:
            return []
        if status in _DONE:
            call.done = True
            text = _content_text(content) or _raw_text(raw_output)
            if not text and status == "failed":
                text = "The call failed."
            result, cut = _head_tail(text or EMPTY_RESULT, RESULT_MAX_CHARS)
            return [
                ToolResultEvent(call.call_id, call.name, result, status == "failed", truncated=cut)
            ]
        if not content or call.live_stopped:
            return []
        return self._live(call, _content_text(content))

    def _live(self, call: _Call, text: str) -> list[Event]:
        """The part of the call's whole output that extends what was shown."""
        if not text.startswith(call.shown):
            # Rewritten, not extended: the result shows it whole.
            call.live_stopped = True
            return []
        new = text[len(call.shown) :]
        room = CALL_OUTPUT_MAX_CHARS - len(call.shown)
        if len(new) > room:
            new, call.live_stopped = new[:room], True
        if not new:
            return []
        taken, notice = self._take(new)
        call.shown += taken
        if len(taken) < len(new):
            call.live_stopped = True
        events: list[Event] = [ShellOutput(call.call_id, taken)] if taken else []
        return events + notice

    # --- plan -----------------------------------------------------------------------

    def _revise(self, entries: Sequence[Any]) -> list[Event]:
        kept: tuple[tuple[tuple[str, str], ...], ...] = tuple(
            (
                ("content", str(entry.content)[:PLAN_ENTRY_CHARS]),
                ("status", str(entry.status)),
                ("priority", str(entry.priority)),
            )
            for entry in entries[:PLAN_MAX_ENTRIES]
        )
        omitted = max(0, len(entries) - PLAN_MAX_ENTRIES)
        if (kept, omitted) == self._plan:
            return []  # re-sent as it was: no revision
        self._plan = (kept, omitted)
        event = PlanEvent(tuple(dict(entry) for entry in kept), omitted)
        if self._plans < PLAN_MAX_REVISIONS:
            return self._log_plan(event)
        first = self._plan_held is None
        self._plan_held = event
        if first and not self._over_budget:
            return [SystemEvent(SystemKind.NOTICE, PLAN_NOTICE.format(count=PLAN_MAX_REVISIONS))]
        return []

    def _log_plan(self, event: PlanEvent) -> list[Event]:
        """The revision logged if its text fits the prompt's budget (each is a chunk of
        its own, whole: a plan is not cut), else the budget's notice."""
        if self._over_budget:
            return []
        size = sum(len(entry["content"]) for entry in event.entries)
        if size > PROMPT_BUDGET_CHARS - self._spent:
            return self._spent_all()
        self._spent += size
        self._plans += 1
        self._plan_logged = event
        return [event]

    # --- the end --------------------------------------------------------------------

    def finish(self) -> list[Event]:
        """The prompt answered: every call seen gets its place and a result (a call the
        agent never finished is answered so; its chunk holds what was known of it)."""
        events: list[Event] = []
        held, self._plan_held = self._plan_held, None
        if held is not None and held != self._plan_logged:
            events += self._log_plan(held)
        for call in self._calls.values():
            if not call.emitted:
                events += self._emit(call)
            if not call.done:
                call.done = True
                events.append(ToolResultEvent(call.call_id, call.name, NO_RESULT, True))
        return events

    def open_calls(self) -> list[str]:
        """The calls emitted and not answered (a Stop answers them)."""
        return [c.call_id for c in self._calls.values() if c.emitted and not c.done]


def usage(response: PromptResponse, context: tuple[int, int] | None) -> Usage | None:
    """The prompt's tokens: the response's own usage, else (Codex) the context the
    agent's last usage_update reported, as the input of its last request."""
    if response.usage is not None:
        u = response.usage
        return Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens + (u.thought_tokens or 0),
            cache_read_tokens=u.cached_read_tokens or 0,
            cache_write_tokens=u.cached_write_tokens or 0,
        )
    if context is not None:
        return Usage(input_tokens=context[0])
    return None


# --- permissions ------------------------------------------------------------------------


def choose(options: Sequence[PermissionOption], approved: bool) -> str | None:
    """The agent's option for Dispatch's answer: Approve -> allow once (allow always only
    when the agent offers nothing else: an "always" of Dispatch's is a Dispatch rule, so
    the agent keeps asking and the rules keep deciding), Deny -> reject once (else
    reject always). None when the agent offers no such option."""
    wanted = ("allow_once", "allow_always") if approved else ("reject_once", "reject_always")
    for kind in wanted:
        for option in options:
            if option.kind == kind:
                return option.option_id
    return None


# --- helpers ----------------------------------------------------------------------------


def _given(raw: Any) -> bool:
    """An input that says something ({} and None do not: Claude Code's first tool_call)."""
    return raw is not None and raw != {} and raw != ""


def _meta_tool(meta: Mapping[str, Any] | None) -> str:
    """Claude Code's own tool name (`_meta.claudeCode.toolName`), if it is one."""
    own = (meta or {}).get("claudeCode")
    name = own.get("toolName") if isinstance(own, Mapping) else None
    return name if isinstance(name, str) and _NAME.fullmatch(name) else ""


def _identity(call: _Call) -> tuple[str, dict[str, Any]]:
    """The call's name and arguments as the log keeps them."""
    raw = call.raw_input
    if call.kind == "execute" and isinstance(raw, Mapping):
        command = _command(raw.get("command"))
        if command:
            return SHELL, {"command": _bounded_str(command)}
    name = call.tool or (call.kind if call.kind and call.kind != "other" else "") or "tool"
    return name, _bounded_input(raw)


def _command(value: Any) -> str:
    """A command as text: a string, or an argv (a shell's `-c` string is the command)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        argv: list[str] = value
        if len(argv) == 3 and posixpath.basename(argv[0]) in _SHELLS and argv[1] in ("-c", "-lc"):
            return argv[2]
        return shlex.join(argv)
    return ""


def _bounded_str(text: str) -> str:
    if len(text) <= INPUT_MAX_CHARS:
        return text
    return text[:INPUT_MAX_CHARS] + f"… [{len(text) - INPUT_MAX_CHARS} characters left out]"


def _bounded_input(raw: Any) -> dict[str, Any]:
    """The input as an object (another value as `input`), within INPUT_MAX_CHARS: long
    strings cut first, then, if still too big, its JSON text cut."""
    if raw is None:
        return {}
    value = raw if isinstance(raw, Mapping) else {"input": raw}
    text = _json(value)
    if len(text) <= INPUT_MAX_CHARS:
        return dict(json.loads(text))
    value = _cut_strings(json.loads(text))
    text = _json(value)
    if len(text) <= INPUT_MAX_CHARS:
        return dict(value)
    return {"input": _bounded_str(text)}


def _cut_strings(value: Any) -> Any:
    if isinstance(value, str) and len(value) > INPUT_STRING_CHARS:
        left = len(value) - INPUT_STRING_CHARS
        return value[:INPUT_STRING_CHARS] + f"… [{left} characters left out]"
    if isinstance(value, list):
        return [_cut_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _cut_strings(v) for k, v in value.items()}
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _content_text(content: Sequence[Any] | None) -> str:
    """A call's content as text: its text blocks, and a diff's file (what was written)."""
    parts: list[str] = []
    for item in content or ():
        if isinstance(item, ContentToolCallContent) and isinstance(item.content, TextContentBlock):
            parts.append(item.content.text)
        elif isinstance(item, FileEditToolCallContent):
            parts.append(f"Edited {item.path}")
    return "\n".join(parts)


def _raw_text(raw: Any) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, Mapping):
        for key in ("output", "formatted_output", "aggregated_output", "stdout"):
            if isinstance(raw.get(key), str) and raw[key]:
                return str(raw[key])
    return _json(raw)


def _head_tail(text: str, cap: int) -> tuple[str, bool]:
    if len(text) <= cap:
        return text, False
    head = cap // 2
    tail = cap - head
    left = len(text) - cap
    return text[:head] + f"\n[... {left} characters left out ...]\n" + text[-tail:], True
