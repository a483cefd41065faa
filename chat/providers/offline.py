"""`offline/demo`: a small deterministic agent that needs no network and no key.

It is the default when no provider is configured, so a fresh install can show
a whole agent turn: it thinks briefly, answers, and calls the workspace tools
when the last user message asks for them (a file name -> read_file, a request
for the file list -> list_files, a backticked command or "run X" -> shell).
Given the results, it summarises them and stops. The same request always gives
the same events.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chat.chunks import Kind, Role
from chat.providers.base import (
    Event,
    Finish,
    Message,
    ReasoningDelta,
    ReasoningEnd,
    Request,
    TextDelta,
    TextPart,
    ToolCallEvent,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from chat.providers.registry import MODELS, OFFLINE_MODEL, STREAM_IDLE_TIMEOUT, ModelInfo

# Tokens per second when neither the caller nor settings say: about the speed
# of a hosted model, so the demo looks like one.
DEFAULT_PACE = 40.0
# More calls than this from one message would be a wall of tool output.
MAX_CALLS = 4
# How much of each tool result the summary quotes.
MAX_LISTED_ENTRIES = 12
MAX_QUOTED_LINES = 12
MAX_QUOTED_LINE_CHARS = 160
# How much of the user's message a plain reply echoes.
MAX_ECHO_CHARS = 120

# File names the demo recognises: a known extension, or a well-known name.
# Anything with a dot would match "e.g." and "example.com".
FILE_EXTENSIONS = (
    "c|cfg|conf|cpp|css|csv|go|h|html|ini|java|js|json|jsx|lock|log|md|py|rb|rs|rst"
    "|sh|sql|toml|ts|tsx|txt|xml|yaml|yml"
)
FILE_RE = re.compile(
    rf"(?<![\w/.-])((?:[\w.-]+/)*\.?[\w-][\w.-]*\.(?:{FILE_EXTENSIONS})"
    r"|(?:[\w.-]+/)*(?:Makefile|Dockerfile|LICENSE|README))(?![\w/-])"
)
BACKTICKED_RE = re.compile(r"`([^`\n]+)`")
RUN_RE = re.compile(r"\b(?:run|execute)\s+([^`\s][^`\n]*?)\s*(?:[.?!](?:\s|$)|$|\n)", re.I)
# "run the tests" names no command: these words start a phrase, not a command.
NOT_A_COMMAND = frozenset(
    {
        *("a", "an", "all", "any", "it", "me", "my", "our", "some"),
        *("that", "the", "these", "this", "those", "what", "which", "your"),
    }
)
LIST_RE = re.compile(
    r"\b(?:list|show|what|which|see)\b[^.?!\n]*\b(?:files?|director(?:y|ies)|folders?|workspace)\b"
    r"|\bls\b",
    re.I,
)
TOKEN_RE = re.compile(r"\s*\S+|\s+$")
# What the greeting suggests, and an empty tab's starter prompts: each works on a new
# workspace's sample project (chat.tools.workdir.SAMPLE).
SUGGESTIONS = ("list the files", "read README.md", "run `python3 hello.py`", "run `ls -la`")


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class Plan:
    """What the demo model will say and do for one request."""

    thinking: str
    text: str
    calls: list[Call] = field(default_factory=list)


class OfflineProvider:
    def __init__(
        self,
        pace: float | None = None,
        *,
        model: ModelInfo | None = None,
        idle_timeout: float = STREAM_IDLE_TIMEOUT,
    ) -> None:
        """`pace` is tokens per second (0: no sleeping); None takes
        settings.DISPATCH_OFFLINE_PACE."""
        self.idle_timeout = idle_timeout
        if pace is None:
            pace = _settings_pace()
        if pace < 0:
            raise ValueError(f"offline pace must be >= 0 tokens/s, not {pace}")
        self.pace = float(pace)
        self.model = model or MODELS[OFFLINE_MODEL]

    def __repr__(self) -> str:
        return f"OfflineProvider(pace={self.pace})"

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        plan = make_plan(request)
        delay = 1 / self.pace if self.pace else 0.0
        output = 0
        for kind, text in ((Kind.THINKING, plan.thinking), (Kind.TEXT, plan.text)):
            for token in TOKEN_RE.findall(text):
                if delay:
                    await asyncio.sleep(delay)
                output += 1
                yield ReasoningDelta(token) if kind == Kind.THINKING else TextDelta(token)
            if kind == Kind.THINKING:
                yield ReasoningEnd()
        prefix = call_id_prefix(request)
        for i, call in enumerate(plan.calls):
            yield ToolCallEvent(f"{prefix}_{i}", call.name, call.arguments)
        usage = Usage(input_tokens=_count_tokens(request), output_tokens=output)
        yield Finish(usage, "tool_use" if plan.calls else "end_turn")


def _settings_pace() -> float:
    from django.conf import settings

    if not settings.configured:
        return DEFAULT_PACE
    return float(getattr(settings, "DISPATCH_OFFLINE_PACE", DEFAULT_PACE))


def call_id_prefix(request: Request) -> str:
    """Deterministic, and different for every distinct conversation state."""
    digest = hashlib.sha256(repr(request.messages).encode()).hexdigest()[:12]
    return f"offline_{digest}"


def _count_tokens(request: Request) -> int:
    texts = [request.system]
    for message in request.messages:
        for part in message.parts:
            texts.append(getattr(part, "text", "") or getattr(part, "result", "") or "")
    return sum(len(TOKEN_RE.findall(t)) for t in texts)


# --- What to say ------------------------------------------------------------------


def make_plan(request: Request) -> Plan:
    """The demo's whole behaviour, as a pure function of the request."""
    last = request.messages[-1] if request.messages else None
    if last is None or last.role != Role.USER:
        return _greeting("")
    results = [p for p in last.parts if isinstance(p, ToolResultPart)]
    text = "\n".join(p.text for p in last.parts if isinstance(p, TextPart)).strip()
    if not results:
        return _answer(text)
    calls = _calls_before(request.messages)
    summary = Plan(
        thinking=(
            f"The {_plural(len(results), 'tool result')} {'is' if len(results) == 1 else 'are'}"
            " back. I'll summarise what they show."
        ),
        text="\n\n".join(_summary(r, calls.get(r.call_id)) for r in results),
    )
    if not text:
        summary.text += (
            "\n\nThat's all from the offline demo. Ask me to read one of these files or "
            "run another command."
        )
        return summary
    # A message sent while the tools ran: answer it in the same step.
    follow = _answer(text)
    return Plan(
        thinking=f"{summary.thinking} Then there is a new message. {follow.thinking}",
        text=f"{summary.text}\n\nAbout your new message: {follow.text}",
        calls=follow.calls,
    )


def _answer(text: str) -> Plan:
    calls = find_calls(text)
    if not calls:
        return _greeting(text)
    steps = [_describe(call) for call in calls]
    names = sorted({call.name for call in calls})
    thinking = (
        f"The user wants me to {_join(steps)}. "
        f"The {_join([f'`{n}`' for n in names])} tool{'s' if len(names) > 1 else ''} "
        f"can do that, so I'll call {'them' if len(calls) > 1 else 'it'} "
        "and look at what comes back."
    )
    intro = "I'm the offline demo model, so I work from simple rules, but I can use real tools."
    text = f"{intro} Let me {_join([_describe(c, markdown=True) for c in calls])}."
    return Plan(thinking, text, calls)


def _greeting(text: str) -> Plan:
    thinking = (
        "No file name, file listing or command in this message, so there is no tool to "
        "call. I'll say what I am and suggest something to try."
    )
    about = ""
    if text:
        quoted = text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 1] + "…"
        about = f" about “{' '.join(quoted.split())}”"
    body = (
        "Hello! I'm **offline/demo**, the offline demo model built into Dispatch. "
        f"I run without a network or an API key, so I can't hold a real conversation{about}, "
        "but I can use the workspace tools like a real agent. Try:\n\n"
        + "".join(f"- *{suggestion}*\n" for suggestion in SUGGESTIONS)
        + "\nTo talk to a real model, set `ANTHROPIC_API_KEY` or `OPENAI_API_KEY` in the "
        "environment, or add a key in Settings."
    )
    return Plan(thinking, body)


def find_calls(text: str) -> list[Call]:
    """The tool calls a message asks for, in the order it asks for them."""
    found: list[tuple[int, Call]] = []
    taken: list[tuple[int, int]] = []  # spans already used by a call

    def free(start: int, end: int) -> bool:
        return all(end <= a or start >= b for a, b in taken)

    for m in BACKTICKED_RE.finditer(text):
        inner = m.group(1).strip()
        if FILE_RE.fullmatch(inner):
            found.append((m.start(), Call("read_file", {"path": inner})))
        elif inner:
            found.append((m.start(), Call("shell", {"command": inner})))
        taken.append(m.span())
    for m in RUN_RE.finditer(text):
        command = m.group(1).strip()
        if free(*m.span(1)) and command.split()[0].lower() not in NOT_A_COMMAND:
            found.append((m.start(), Call("shell", {"command": command})))
            taken.append(m.span(1))
    for m in LIST_RE.finditer(text):
        if free(*m.span()):
            found.append((m.start(), Call("list_files", {"path": "."})))
            break
    for m in FILE_RE.finditer(text):
        if free(*m.span()):
            found.append((m.start(), Call("read_file", {"path": m.group(1)})))
    calls: list[Call] = []
    for _, call in sorted(found, key=lambda item: item[0]):
        if call not in calls:
            calls.append(call)
    return calls[:MAX_CALLS]


def _describe(call: Call, *, markdown: bool = False) -> str:
    def code(s: str) -> str:
        return f"`{s}`" if markdown else s

    match call.name:
        case "list_files":
            return "list the files in the workspace"
        case "read_file":
            return f"read {code(call.arguments['path'])}"
        case "shell":
            return f"run {code(call.arguments['command'])}"
    return f"call {call.name}"


def _calls_before(messages: Sequence[Message]) -> dict[str, ToolCallPart]:
    if len(messages) < 2 or messages[-2].role != Role.ASSISTANT:
        return {}
    return {p.call_id: p for p in messages[-2].parts if isinstance(p, ToolCallPart)}


def _summary(result: ToolResultPart, call: ToolCallPart | None) -> str:
    name = call.name if call else result.name
    arguments: Mapping[str, Any] = call.arguments if call else {}
    lines = result.result.splitlines()
    if result.is_error:
        first = lines[0] if lines else "no details"
        return f"`{name}` failed: {first}"
    if name == "list_files":
        entries = [line.strip() for line in lines if line.strip()]
        if not entries:
            return "The workspace is empty: there are no files yet."
        shown = "\n".join(f"- `{e}`" for e in entries[:MAX_LISTED_ENTRIES])
        more = len(entries) - MAX_LISTED_ENTRIES
        tail = f"\n- …and {more} more" if more > 0 else ""
        return f"The workspace listing has {_plural(len(entries), 'entry')}:\n\n{shown}{tail}"
    if name == "read_file":
        path = arguments.get("path", "the file")
        if not lines:
            return f"`{path}` is empty."
        return f"`{path}` is {_plural(len(lines), 'line')} long. It begins:\n\n{_quote(lines)}"
    if name == "shell":
        command = arguments.get("command", "the command")
        if not lines:
            return f"`{command}` ran and printed nothing."
        return f"`{command}` printed {_plural(len(lines), 'line')}:\n\n{_quote(lines)}"
    if not lines:
        return f"`{name}` returned nothing."
    return f"`{name}` returned {_plural(len(lines), 'line')}:\n\n{_quote(lines)}"


def _quote(lines: list[str]) -> str:
    shown = [
        line if len(line) <= MAX_QUOTED_LINE_CHARS else line[: MAX_QUOTED_LINE_CHARS - 1] + "…"
        for line in lines[:MAX_QUOTED_LINES]
    ]
    if len(lines) > MAX_QUOTED_LINES:
        shown.append(f"… ({len(lines) - MAX_QUOTED_LINES} more lines)")
    body = "\n".join(shown)
    # A fence longer than any backtick run inside, so the quote cannot end early.
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{body}\n{fence}"


def _plural(n: int, noun: str) -> str:
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
