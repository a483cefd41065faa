"""chat.acp.updates: ACP session updates -> the reducer's events. Pure.

The updates are the SDK's own models (`acp.schema`), validated from the wire shapes the
real agents were recorded sending (issue 30): Claude Code's double `tool_call`, Codex's
argv commands and `usage_update`, whole `content` re-sent by each `tool_call_update`.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest
from acp.schema import PermissionOption, PromptResponse, SessionNotification, ToolCallUpdate
from hypothesis import given, settings
from hypothesis import strategies as st

from chat import chunks
from chat.acp import updates as u
from chat.acp.updates import Updates
from chat.chunks import Kind, Role
from chat.history import History
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
from chat.stream import Reducer
from tests.pure_helpers import MemoryLog

TURN = uuid.UUID(int=7)


def upd(shape: dict[str, Any]) -> object:
    """One `session/update` as the SDK reads it off the wire."""
    return SessionNotification.model_validate({"sessionId": "s1", "update": shape}).update


def text(kind: str, value: str) -> object:
    return upd({"sessionUpdate": kind, "content": {"type": "text", "text": value}})


def start(call_id: str, **fields: Any) -> object:
    return upd({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "", **fields})


def progress(call_id: str, **fields: Any) -> object:
    return upd({"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields})


def out(value: str) -> list[dict[str, Any]]:
    return [{"type": "content", "content": {"type": "text", "text": value}}]


def plan(*entries: tuple[str, str]) -> object:
    return upd(
        {
            "sessionUpdate": "plan",
            "entries": [{"content": c, "status": s, "priority": "medium"} for c, s in entries],
        }
    )


def feed(*items: object) -> list[Event]:
    mapper = Updates()
    events: list[Event] = []
    for item in items:
        events += mapper.feed(item)
    return events


CLAUDE_BASH = {"claudeCode": {"toolName": "Bash"}}

# update(s) -> the events they make (each row a fresh Updates).
TABLE: list[tuple[str, list[object], list[Event]]] = [
    ("message", [text("agent_message_chunk", "Hello")], [TextDelta("Hello")]),
    ("thought", [text("agent_thought_chunk", "Hm")], [ReasoningDelta("Hm")]),
    (
        "an image in a message is left out",
        [
            upd(
                {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "image", "data": "AA==", "mimeType": "image/png"},
                }
            )
        ],
        [],
    ),
    (
        "claude code: tool_call with empty input, then again with the command",
        [
            start("t1", kind="execute", status="pending", rawInput={}, _meta=CLAUDE_BASH),
            start(
                "t1",
                title="`ls -la`",
                kind="execute",
                status="pending",
                rawInput={"command": "ls -la", "description": "List"},
                _meta=CLAUDE_BASH,
            ),
        ],
        [ToolCallEvent("t1", "shell", {"command": "ls -la"}, title="`ls -la`")],
    ),
    (
        "claude code: its call's content is the description, never output",
        [
            start("t1", kind="execute", status="pending", rawInput={}, _meta=CLAUDE_BASH),
            start(
                "t1",
                title="`ls`",
                kind="execute",
                status="pending",
                content=out("List files"),
                rawInput={"command": "ls", "description": "List files"},
                _meta=CLAUDE_BASH,
            ),
            start("t1", kind="execute", status="pending", content=out("List files")),
            progress("t1", status="completed", content=out("a.txt"), rawOutput="a.txt"),
        ],
        [
            ToolCallEvent("t1", "shell", {"command": "ls"}, title="`ls`"),
            ToolResultEvent("t1", "shell", "a.txt", False),
        ],
    ),
    (
        "codex: an argv command, in progress at once",
        [
            start(
                "call_9",
                title="Run ls",
                kind="execute",
                status="in_progress",
                rawInput={"command": ["bash", "-lc", "ls"], "cwd": "/w"},
            )
        ],
        [ToolCallEvent("call_9", "shell", {"command": "ls"}, title="Run ls")],
    ),
    (
        "an argv without a shell is joined as words",
        [start("c", kind="execute", rawInput={"command": ["git", "commit", "-m", "a b"]})],
        [ToolCallEvent("c", "shell", {"command": "git commit -m 'a b'"})],
    ),
    (
        "another tool keeps the agent's name and input",
        [
            start(
                "r",
                title="Read README.md",
                kind="read",
                rawInput={"file_path": "/w/README.md"},
                _meta={"claudeCode": {"toolName": "Read"}},
            )
        ],
        [ToolCallEvent("r", "Read", {"file_path": "/w/README.md"}, title="Read README.md")],
    ),
    (
        "no tool name: the kind",
        [start("r", kind="search", rawInput={"pattern": "x"})],
        [ToolCallEvent("r", "search", {"pattern": "x"})],
    ),
    (
        "an input that is no object",
        [start("r", rawInput="just text")],
        [ToolCallEvent("r", "tool", {"input": "just text"})],
    ),
    (
        "live output: only what extends what was shown, then the result",
        [
            start("t", kind="execute", rawInput={"command": "make"}),
            progress("t", status="in_progress", content=out("a\n")),
            progress("t", status="in_progress", content=out("a\nb\n")),
            progress("t", status="in_progress", content=out("a\nb\n")),
            progress("t", status="completed", content=out("a\nb\nc\n"), rawOutput={"x": 1}),
            progress("t", status="completed", content=out("again")),
        ],
        [
            ToolCallEvent("t", "shell", {"command": "make"}),
            ShellOutput("t", "a\n"),
            ShellOutput("t", "b\n"),
            ToolResultEvent("t", "shell", "a\nb\nc\n", False),
        ],
    ),
    (
        "a failed call, its raw output the result",
        [
            start("t", kind="execute", rawInput={"command": "false"}),
            progress("t", status="failed", rawOutput={"output": "boom", "exit_code": 1}),
        ],
        [
            ToolCallEvent("t", "shell", {"command": "false"}),
            ToolResultEvent("t", "shell", "boom", True),
        ],
    ),
    (
        "an update first: the call is made from it",
        [progress("u", kind="edit", title="Edit a.py", status="in_progress")],
        [ToolCallEvent("u", "edit", {}, title="Edit a.py")],
    ),
    (
        "a diff's content says what was edited",
        [
            start("e", kind="edit", rawInput={"file_path": "a.py"}),
            progress(
                "e",
                status="completed",
                content=[{"type": "diff", "path": "/w/a.py", "oldText": "a", "newText": "b"}],
            ),
        ],
        [
            ToolCallEvent("e", "edit", {"file_path": "a.py"}),
            ToolResultEvent("e", "edit", "Edited /w/a.py", False),
        ],
    ),
    (
        "a plan, revised, re-sent unchanged",
        [
            plan(("Read", "in_progress"), ("Fix", "pending")),
            plan(("Read", "in_progress"), ("Fix", "pending")),
            plan(("Read", "completed"), ("Fix", "in_progress")),
        ],
        [
            PlanEvent(
                (
                    {"content": "Read", "status": "in_progress", "priority": "medium"},
                    {"content": "Fix", "status": "pending", "priority": "medium"},
                )
            ),
            PlanEvent(
                (
                    {"content": "Read", "status": "completed", "priority": "medium"},
                    {"content": "Fix", "status": "in_progress", "priority": "medium"},
                )
            ),
        ],
    ),
    (
        "usage_update, available commands, a mode: nothing in the log",
        [
            upd({"sessionUpdate": "usage_update", "used": 1200, "size": 200000}),
            upd(
                {
                    "sessionUpdate": "available_commands_update",
                    "availableCommands": [{"name": "init", "description": "x"}],
                }
            ),
            upd({"sessionUpdate": "current_mode_update", "currentModeId": "default"}),
            text("user_message_chunk", "replayed"),
        ],
        [],
    ),
]


@pytest.mark.parametrize(
    ("updates", "events"), [row[1:] for row in TABLE], ids=[r[0] for r in TABLE]
)
def test_each_update_kind(updates: list[object], events: list[Event]) -> None:
    assert feed(*updates) == events


def test_usage_update_is_kept_for_the_driver() -> None:
    mapper = Updates()
    mapper.feed(
        upd(
            {
                "sessionUpdate": "usage_update",
                "used": 5,
                "size": 10,
                "cost": {"amount": 0.25, "currency": "USD"},
            }
        )
    )
    assert (mapper.context, mapper.cost) == ((5, 10), (0.25, "USD"))
    bare = PromptResponse(stop_reason="end_turn")
    assert u.usage(bare, mapper.context) == Usage(input_tokens=5)
    assert u.usage(bare, None) is None
    full = PromptResponse.model_validate(
        {
            "stopReason": "end_turn",
            "usage": {
                "totalTokens": 30,
                "inputTokens": 10,
                "outputTokens": 15,
                "thoughtTokens": 5,
                "cachedReadTokens": 3,
            },
        }
    )
    assert u.usage(full, mapper.context) == Usage(10, 20, 3, 0)


def test_finish_answers_every_call_left_open() -> None:
    mapper = Updates()
    mapper.feed(start("held", kind="execute", rawInput={}))
    mapper.feed(start("running", kind="execute", rawInput={"command": "sleep 9"}))
    assert mapper.open_calls() == ["running"]
    assert mapper.finish() == [
        ToolCallEvent("held", "execute", {}),
        ToolResultEvent("held", "execute", u.NO_RESULT, True),
        ToolResultEvent("running", "shell", u.NO_RESULT, True),
    ]
    assert mapper.finish() == []


def test_a_permission_request_emits_its_call_with_the_input_it_carries() -> None:
    mapper = Updates()
    assert mapper.feed(start("t", kind="execute", rawInput={})) == []
    asked = ToolCallUpdate.model_validate(
        {"toolCallId": "t", "title": "`rm x`", "rawInput": {"command": "rm x"}}
    )
    events, call_id, name, arguments = mapper.call(asked)
    assert events == [ToolCallEvent("t", "shell", {"command": "rm x"}, title="`rm x`")]
    assert (call_id, name, arguments) == ("t", "shell", {"command": "rm x"})
    # Asked again (the call is on the page already): nothing new, the same identity.
    assert mapper.call(asked) == ([], "t", "shell", {"command": "rm x"})


CLAUDE_OPTIONS = [
    PermissionOption(option_id="allow_always", name="Always Allow", kind="allow_always"),
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]
CODEX_OPTIONS = [
    PermissionOption(option_id="approved", name="Yes", kind="allow_once"),
    PermissionOption(option_id="approved-execpolicy-amendment", name="Always", kind="allow_always"),
    PermissionOption(option_id="abort", name="No", kind="reject_once"),
]


@pytest.mark.parametrize(
    ("options", "approved", "chosen"),
    [
        (CLAUDE_OPTIONS, True, "allow"),
        (CLAUDE_OPTIONS, False, "reject"),
        (CODEX_OPTIONS, True, "approved"),
        (CODEX_OPTIONS, False, "abort"),
        (CLAUDE_OPTIONS[:1], True, "allow_always"),
        (CLAUDE_OPTIONS[:2], False, None),
    ],
)
def test_choose_maps_dispatchs_answer_to_the_agents_option(
    options: list[PermissionOption], approved: bool, chosen: str | None
) -> None:
    assert u.choose(options, approved) == chosen


# --- bounds ------------------------------------------------------------------------------


def test_a_rawinput_resent_with_every_update_is_read_once() -> None:
    """A huge rawInput in every update: the call's chunk holds it once, cut to the cap,
    and nothing after the call grows with it."""
    huge = {"command": "cat > f <<EOF\n" + "x" * 1_000_000 + "\nEOF"}
    mapper = Updates()
    events = mapper.feed(start("t", kind="execute", rawInput=huge))
    for n in range(50):
        events += mapper.feed(
            progress("t", status="in_progress", rawInput=huge, content=out("line\n" * (n + 1)))
        )
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    assert len(json.dumps(call.arguments)) < u.INPUT_MAX_CHARS + 100
    live = "".join(e.text for e in events if isinstance(e, ShellOutput))
    assert live == "line\n" * 50


def test_an_object_input_keeps_its_keys_with_long_strings_cut() -> None:
    (call,) = feed(
        start("w", kind="edit", rawInput={"file_path": "a.py", "content": "y" * 100_000})
    )
    assert isinstance(call, ToolCallEvent)
    assert call.arguments["file_path"] == "a.py"
    assert len(call.arguments["content"]) < u.INPUT_STRING_CHARS + 50


def test_live_output_stops_at_the_calls_cap_and_the_result_keeps_head_and_tail() -> None:
    mapper = Updates()
    events = mapper.feed(start("t", kind="execute", rawInput={"command": "yes"}))
    whole = ""
    for _ in range(40):
        whole += "y\n" * 2000
        events += mapper.feed(progress("t", status="in_progress", content=out(whole)))
    events += mapper.feed(progress("t", status="completed", content=out(whole)))
    live = "".join(e.text for e in events if isinstance(e, ShellOutput))
    assert len(live) == u.CALL_OUTPUT_MAX_CHARS
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert result.truncated and len(result.result) < u.RESULT_MAX_CHARS + 100
    assert result.result.startswith("y\n") and result.result.endswith("y\n")


def test_a_frame_is_capped_and_the_prompt_budget_ends_with_one_notice() -> None:
    mapper = Updates()
    (first,) = mapper.feed(text("agent_message_chunk", "z" * (u.FRAME_MAX_CHARS * 2)))
    assert isinstance(first, TextDelta) and len(first.text) < u.FRAME_MAX_CHARS + 100
    events: list[Event] = []
    for _ in range(u.PROMPT_BUDGET_CHARS // u.FRAME_MAX_CHARS + 2):
        events += mapper.feed(text("agent_message_chunk", "z" * u.FRAME_MAX_CHARS))
    notices = [e for e in events if isinstance(e, SystemEvent)]
    assert len(notices) == 1
    streamed = len(first.text) + sum(len(e.text) for e in events if isinstance(e, TextDelta))
    assert streamed == u.PROMPT_BUDGET_CHARS
    assert mapper.feed(text("agent_message_chunk", "more")) == []


def test_calls_past_the_cap_are_left_out_with_one_notice(monkeypatch) -> None:
    monkeypatch.setattr(u, "CALLS_MAX", 2)
    mapper = Updates()
    events: list[Event] = []
    for n in range(4):
        events += mapper.feed(start(f"c{n}", kind="execute", rawInput={"command": f"e {n}"}))
        events += mapper.feed(progress(f"c{n}", status="completed", content=out("ok")))
    assert [type(e).__name__ for e in events] == [
        "ToolCallEvent",
        "ToolResultEvent",
        "ToolCallEvent",
        "ToolResultEvent",
        "SystemEvent",
    ]
    # A permission asked for one of them is still judged by what it asks.
    asked = ToolCallUpdate.model_validate(
        {"toolCallId": "c9", "kind": "execute", "rawInput": {"command": "rm -rf /"}}
    )
    assert mapper.call(asked) == ([], "c9", "shell", {"command": "rm -rf /"})
    assert mapper.finish() == []


def test_a_plan_is_capped() -> None:
    (event,) = feed(plan(*[("x" * 5000, "pending")] * (u.PLAN_MAX_ENTRIES + 3)))
    assert isinstance(event, PlanEvent)
    assert len(event.entries) == u.PLAN_MAX_ENTRIES and event.omitted == 3
    assert len(event.entries[0]["content"]) == u.PLAN_ENTRY_CHARS


def _revisions(count: int, size: int = 1) -> list[object]:
    """`count` plans, each different (one entry done more), of 100 entries of `size`."""
    return [
        plan(*[(f"{n}" * size, "completed" if n < r else "pending") for n in range(100)])
        for r in range(count)
    ]


def test_a_prompts_plan_revisions_past_the_cap_log_only_the_last_at_its_end() -> None:
    mapper = Updates()
    events: list[Event] = []
    for revision in _revisions(u.PLAN_MAX_REVISIONS + 20):
        events += mapper.feed(revision)
    plans = [e for e in events if isinstance(e, PlanEvent)]
    assert len(plans) == u.PLAN_MAX_REVISIONS
    notice = SystemEvent(chunks.SystemKind.NOTICE, u.PLAN_NOTICE.format(count=u.PLAN_MAX_REVISIONS))
    assert events[-1] == notice and events.count(notice) == 1
    (last,) = mapper.finish()
    assert isinstance(last, PlanEvent)
    assert sum(e["status"] == "completed" for e in last.entries) == u.PLAN_MAX_REVISIONS + 19
    # Back to what was logged last: nothing more to log at the end.
    again = Updates()
    revisions = _revisions(u.PLAN_MAX_REVISIONS + 1)
    for revision in [*revisions, revisions[-2]]:
        again.feed(revision)
    assert again.finish() == []


def test_plan_revisions_count_against_the_prompts_budget() -> None:
    """The reviewer's flood: revisions of 100 entries of 1000 characters each."""
    mapper = Updates()
    events: list[Event] = []
    for revision in _revisions(u.PLAN_MAX_REVISIONS, size=1000):
        events += mapper.feed(revision)
    events += mapper.feed(text("agent_message_chunk", "and more"))
    events += mapper.finish()
    logged = sum(len(x["content"]) for e in events if isinstance(e, PlanEvent) for x in e.entries)
    assert 0 < logged <= u.PROMPT_BUDGET_CHARS
    budget = u.BUDGET_NOTICE.format(chars=u.PROMPT_BUDGET_CHARS)
    assert [e.text for e in events if isinstance(e, SystemEvent)] == [budget]
    assert not any(isinstance(e, TextDelta) for e in events)


# --- any interleaving gives a valid log ----------------------------------------------


def _call_script(call_id: str, rng: random.Random) -> list[object]:
    """One call as an agent may send it: maybe an empty first tool_call, the input,
    growing output (sometimes rewritten), maybe a duplicate end."""
    script: list[object] = []
    if rng.random() < 0.5:
        script.append(start(call_id, kind="execute", rawInput={}))
    script.append(start(call_id, kind="execute", rawInput={"command": f"echo {call_id}"}))
    whole = ""
    for _ in range(rng.randrange(4)):
        whole = whole + "o" * rng.randrange(5) if rng.random() < 0.8 else "rewritten"
        script.append(progress(call_id, status="in_progress", content=out(whole)))
    if rng.random() < 0.8:
        status = rng.choice(["completed", "failed"])
        script.append(progress(call_id, status=status, content=out(whole + "end")))
    return script


def _interleave(scripts: list[list[object]], rng: random.Random) -> list[object]:
    """The scripts merged in a random order, each keeping its own."""
    queues = [list(s) for s in scripts if s]
    merged: list[object] = []
    while queues:
        q = rng.choice(queues)
        merged.append(q.pop(0))
        if not q:
            queues.remove(q)
    return merged


def _split(message: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(message)), min(3, len(message) - 1)))
    return [message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_any_interleaving_of_updates_gives_a_valid_log(seed: int) -> None:
    rng = random.Random(seed)
    said = "The answer is 42."
    thought = "Let me think."
    scripts = [
        [text("agent_message_chunk", piece) for piece in _split(said, rng)],
        [text("agent_thought_chunk", piece) for piece in _split(thought, rng)],
        [plan(("a", "pending")), plan(("a", "completed"))],
        *[_call_script(f"c{n}", rng) for n in range(rng.randrange(4))],
    ]
    mapper = Updates()
    reducer = Reducer(TURN, step=1)
    log = MemoryLog()
    log.user("go", TURN)
    for item in _interleave(scripts, rng):
        for event in mapper.feed(item):
            log.apply(reducer.feed(event))
    for event in mapper.finish():
        log.apply(reducer.feed(event))
    log.apply(reducer.seal())

    assert reducer.open is None and not reducer.pending_calls
    for block in log.blocks:
        chunks.check_kind(block.role, block.type)
        chunks.check_data(block.role, block.type, block.data)
    # What the agent said and thought is all there, in order.
    assert "".join(b.data["text"] for b in log.blocks if b.type == Kind.TEXT and b.seq != 1) == said
    assert "".join(b.data["text"] for b in log.blocks if b.type == Kind.THINKING) == thought
    # Each call once, before its one final result.
    calls = [b for b in log.blocks if b.type == Kind.TOOL_CALL]
    assert len({b.data["call_id"] for b in calls}) == len(calls) == len(scripts) - 3
    for call in calls:
        ends = [
            b
            for b in log.blocks
            if b.type == Kind.TOOL_RESULT
            and b.data["call_id"] == call.data["call_id"]
            and "result" in b.data
        ]
        assert len(ends) == 1 and ends[0].seq is not None and call.seq is not None
        assert ends[0].seq > call.seq
    plans = [b for b in log.blocks if b.type == Kind.PLAN]
    assert [p.data["entries"][0]["status"] for p in plans] == ["pending", "completed"]
    assert all(p.role == Role.ASSISTANT for p in plans)
    # A model the tab switches to can be sent this log.
    History.build(log.blocks).messages()
